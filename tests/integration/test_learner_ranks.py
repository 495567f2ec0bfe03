"""The learner's engines on real ranks (torchrun, gloo, CPU): world size 1 and 2 train the same update.

Each case starts `ranks_child.py` under torchrun: every rank builds the same model, rank 0 drives the
update on one fixed batch (three prompts, three rollouts each) as the learner service does, the ranks
each train their share, and rank 0 writes the loss, the per-rank timings and the gathered weights.
The reference is plain torch in one process.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
RENDEZVOUS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DS_ACCELERATOR")


def train(tmp_path, engine: str, world: int, *options: str) -> dict:
    """Run `ranks_child` on `world` ranks (plain torch: one process, no launcher); its result."""
    out = tmp_path / f"{Path(engine).stem}-{world}-{len(list(tmp_path.iterdir()))}.pt"
    env = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS}
    child = ["-m", "tests.integration.ranks_child", engine, str(out), *options]
    launcher = [] if engine == "torch" else ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}"]
    done = subprocess.run([sys.executable, *launcher, *child], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=540)
    assert done.returncode == 0, done.stderr[-12000:]
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def plain_torch(tmp_path_factory):
    """Plain torch's result for a set of options, computed once per set (both engines compare with it)."""
    results: dict[tuple[str, ...], dict] = {}

    def result(*options: str) -> dict:
        if options not in results:
            results[options] = train(tmp_path_factory.mktemp("torch"), "torch", 1, *options)
        return results[options]

    return result


def max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture
def zero3(tmp_path) -> str:
    path = tmp_path / "zero3.json"
    path.write_text('{"zero_optimization": {"stage": 3}}')
    return str(path)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", ["fsdp", "zero3"])
@pytest.mark.parametrize("options", [(), ("--lora", "4", "--packed", "--checkpointing")],
                         ids=["full", "lora-packed-checkpointing"])
def test_two_ranks_train_what_one_rank_trains(tmp_path, kind, options, zero3, plain_torch):
    engine = zero3 if kind == "zero3" else "fsdp"
    reference = plain_torch(*options)
    one, two = train(tmp_path, engine, 1, *options), train(tmp_path, engine, 2, *options)
    assert one["trainer"] == two["trainer"] == ("DeepSpeedTrainer" if kind == "zero3" else "FSDPTrainer")
    assert two["world"] == 2 and len(two["times"]) == 2 and len(one["times"]) == 1
    for run in (one, two):
        # the token-mean over both ranks' tokens, not a mean of per-rank means
        assert run["metrics"]["loss"] == pytest.approx(reference["metrics"]["loss"], rel=1e-5)
        assert run["metrics"]["grad_norm"] == pytest.approx(reference["metrics"]["grad_norm"], rel=1e-5)
        assert run["metrics"]["loss_tokens"] == reference["metrics"]["loss_tokens"]
    # Adam's first step moves each weight by about lr (1e-3): far above these tolerances
    assert max_diff(two["weights"], one["weights"]) < 1e-5
    for run in (one, two):  # a push streamed from the ranks sends the weights, and leaves them in step
        assert torch.equal(run["pushed"], torch.cat([t.reshape(-1) for t in run["weights"].values()]))
        assert max_diff(run["after_push"], run["weights"]) == 0
    assert max_diff(two["weights"], reference["weights"]) < 2e-5
    assert max_diff(two["weights"], two["start"]) > 1e-5  # the update moved the (merged) weights


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["fsdp", "zero3"])
def test_a_sharded_checkpoint_reads_back_into_a_fresh_group(tmp_path, kind, zero3):
    run = train(tmp_path, zero3 if kind == "zero3" else "fsdp", 2, "--checkpoint", str(tmp_path / "ckpt"))
    assert max_diff(run["reloaded"], run["weights"]) == 0.0
    folder = tmp_path / "ckpt" / "checkpoints" / "step-000001"
    shards = list((folder / "dcp").glob("*.distcp")) if kind == "fsdp" else list(folder.rglob("*optim_states.pt"))
    assert len(shards) == 2, sorted(p.name for p in folder.rglob("*"))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["fsdp", "zero3"])
def test_no_rank_loads_the_whole_model_and_the_sharded_reference_agrees(tmp_path, kind, zero3, plain_torch):
    """The learner's own loading (`build.load_trainer`). FSDP2: every rank builds the model on the meta
    device and takes its shards from rank 0, the only one that reads the weights (rank 1 fails if it
    tries). ZeRO-3: each rank loads its partitions only (a rank fails if it loads a whole tensor). The
    KL reference is sharded the same way, and the update is plain torch's."""
    reference = plain_torch("--kl", "0.1")
    two = train(tmp_path, zero3 if kind == "zero3" else "fsdp", 2, "--kl", "0.1",
                "--model-dir", str(tmp_path / "model"))
    assert two["trainer"] == ("DeepSpeedTrainer" if kind == "zero3" else "FSDPTrainer") and two["world"] == 2
    assert max_diff(two["start"], reference["start"]) == 0.0
    for key in ("loss", "kl", "grad_norm"):
        assert two["metrics"][key] == pytest.approx(reference["metrics"][key], rel=1e-5, abs=1e-9)
    assert max_diff(two["weights"], reference["weights"]) < 2e-5
    assert max_diff(two["weights"], two["start"]) > 1e-5

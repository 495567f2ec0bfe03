"""Agent runtime configuration and model name resolution."""
import threading
import time

import pytest

from coevolve.services.agent import models
from coevolve.services.agent.generation import request_seed
from coevolve.services.agent.config import BackendConfig, EpisodeLimits, SamplingConfig
from coevolve.services.runtime.config import ConfigError, load


def test_bad_backend_settings_fail_with_a_fix():
    with pytest.raises(ConfigError, match="choose one of vllm, transformers, openai"):
        BackendConfig(backend="tgi")
    with pytest.raises(ConfigError, match="--base-url"):
        BackendConfig(backend="openai")
    with pytest.raises(ConfigError, match="dtype"):
        BackendConfig(dtype="int4")
    with pytest.raises(ConfigError, match="cpu_threads=-1"):
        BackendConfig(cpu_threads=-1)
    with pytest.raises(ConfigError, match=r"top_p in \(0, 1\]"):
        SamplingConfig(top_p=0)
    with pytest.raises(ConfigError, match="max_user_turns=0"):
        EpisodeLimits(max_user_turns=0)
    with pytest.raises(ConfigError, match="tool_docs='short': choose one of full, signatures"):
        EpisodeLimits(tool_docs="short")
    with pytest.raises(ConfigError, match=r"call_limit_s=-1 must be >= 0 \(0: unbounded\)"):
        EpisodeLimits(call_limit_s=-1)
    with pytest.raises(ConfigError, match="call_memory_mb=64 at least 256"):
        EpisodeLimits(call_memory_mb=64)


def test_the_model_cache_folder_comes_from_coevolve_home(tmp_path):
    config = load(BackendConfig, "agent", {}, environ={"COEVOLVE_HOME": str(tmp_path), "AGENT_BACKEND": "transformers"})
    assert config.coevolve_home == tmp_path and config.backend == "transformers"


def test_request_seeds_differ_per_request_and_repeat_per_call():
    sampling = SamplingConfig(seed=7)
    seeds = {request_seed(sampling, 1, i) for i in range(8)}
    assert len(seeds) == 8 and request_seed(sampling, 1, 3) == request_seed(sampling, 1, 3)
    assert request_seed(SamplingConfig(), 1, 0) is None


def test_an_unknown_model_name_lists_what_is_known(tmp_path):
    with pytest.raises(models.ModelError, match="smollm2-135m-instruct nor tiny-random"):
        models.resolve_model("gpt-7", tmp_path)


def test_a_local_directory_with_a_config_resolves_to_itself(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert models.resolve_model(str(tmp_path), tmp_path / "home") == tmp_path.resolve()


def test_parallel_builders_build_once_and_later_callers_reuse_the_cache(tmp_path):
    builds = []

    def build(out, home):
        builds.append(1)
        time.sleep(0.3)
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        return "test"

    results = []
    threads = [threading.Thread(target=lambda: results.append(models.cached_model(tmp_path, "m", build))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and len(set(results)) == 1
    assert (results[0] / "config.json").is_file() and (results[0] / models.MARKER).is_file()
    assert models.cached_model(tmp_path, "m", build) == results[0] and len(builds) == 1


def test_a_failed_build_leaves_nothing_that_looks_built(tmp_path):
    def broken(out, home):
        out.mkdir(parents=True)
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        models.cached_model(tmp_path, "m", broken)
    assert not (tmp_path / "models" / "m").exists()


"""The agent runtime's configuration: which model and backend, how to sample, and episode limits.

BackendConfig, GenerationConfig and EpisodeLimits are parts of the services' settings (and of
`coevolve eval`'s, EvalSettings)
(`services/runtime/config.py`): `EXPLORER_MODEL`, then `MODEL`, then the default. SamplingConfig is
what one batch of generations is asked for, built by the services from their settings.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from coevolve.services.agent.precision import DTYPES
from coevolve.services.envs.bfcl_data import TOOL_DOCS
from coevolve.services.runtime.config import ConfigError, Settings, doc

BACKENDS = ("vllm", "transformers", "openai", "vllm-server")


def default_home() -> Path:
    return Path.home() / ".cache" / "coevolve"


@dataclass(frozen=True)
class BackendConfig:
    """Which model answers, through which backend, with which resources."""

    model: str = doc("smollm2-135m-instruct", "Model: smollm2-135m-instruct, tiny-random, a local Hugging "
                     "Face directory, or (openai backend) the endpoint's model name.")
    backend: str = doc("vllm", "Generation backend: vllm (in-process), transformers, openai (HTTP), or "
                     "vllm-server (the learner's rollout fleet: token-in/token-out over HTTP, weights pushed "
                     "through vLLM's weight-transfer API).")
    coevolve_home: Path = doc(default_home(), "Cache folder for converted and generated models ($COEVOLVE_HOME).")
    dtype: str = doc("auto", "Weights dtype of local backends: auto (bfloat16 where the GPU or CPU computes it "
                     "natively, AMX or AVX512-BF16; else float32), bfloat16, float32 or float16.")
    seed: int = doc(0, "Seed of the engine and of sampling.")
    max_model_len: int = doc(8192, "Longest sequence (prompt and completion) a local engine accepts, in tokens.")
    enforce_eager: bool = doc(True, "vLLM: skip graph compilation (8 s start here instead of 64 s).")
    kv_cache_gib: float = doc(2.0, "vLLM on CPU: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE).")
    gpu_memory_utilization: float = doc(0.3, "vLLM on GPU: share of device memory the engine may take.")
    cpu_threads: int = doc(0, "CPU threads of this process's torch (local engines and, in the learner, training); "
                           "0 keeps torch's default, one per core. Processes that share the cores should split "
                           "them: two-thread OpenMP teams in three processes on two cores spin-wait on each other.")
    batch_size: int = doc(16, "transformers: sequences per generate call.")
    base_url: str = doc("", "openai: the endpoint, e.g. http://127.0.0.1:8000/v1.")
    api_key_env: str = doc("OPENAI_API_KEY", "openai: environment variable holding the API key (a secret; "
                           "never a flag, never logged).")
    request_timeout_s: float = doc(120.0, "openai: timeout of one request, in seconds.")
    max_retries: int = doc(3, "openai: retries of a failed request, with exponential backoff.")
    concurrency: int = doc(8, "openai: requests in flight at once.")

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend={self.backend!r}: choose one of {', '.join(BACKENDS)}")
        if self.backend == "openai" and not self.base_url:
            raise ConfigError("the openai backend needs base_url (--base-url http://HOST:PORT/v1)")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype={self.dtype!r}: choose {', '.join(DTYPES)}")
        for name in ("max_model_len", "batch_size", "concurrency"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be at least 1")
        if self.cpu_threads < 0:
            raise ConfigError(f"cpu_threads={self.cpu_threads} must be 0 (torch's default) or a thread count")
        if self.kv_cache_gib <= 0 or not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError("kv_cache_gib must be positive and gpu_memory_utilization in (0, 1]")


@dataclass(frozen=True)
class GenerationConfig:
    """How a service's LLM samples its episodes and its structured (JSON) answers."""

    temperature: float = doc(0.7, "Sampling temperature of the service's generations; 0 is greedy.")
    max_new_tokens: int = doc(256, "New tokens per generation in an episode.")
    json_max_new_tokens: int = doc(1024, "New tokens per structured answer (JSON); the schema's bounds keep a "
                                         "complete answer within it.")

    def __post_init__(self) -> None:
        if min(self.max_new_tokens, self.json_max_new_tokens) < 1 or self.temperature < 0:
            raise ConfigError("max_new_tokens and json_max_new_tokens must be >= 1, temperature >= 0")


@dataclass(frozen=True)
class SamplingConfig:
    """How each generation samples; temperature 0 is greedy."""

    temperature: float = doc(1.0, "Sampling temperature; 0 is greedy.")
    top_p: float = doc(1.0, "Nucleus sampling mass.")
    max_new_tokens: int = doc(256, "New tokens per generation.")
    seed: int | None = doc(None, "Sampling seed; each request derives its own from it. None: unseeded.")
    stop: tuple[str, ...] = doc((), "Strings that end a generation (kept out of the text).")

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.max_new_tokens < 1:
            raise ConfigError("temperature must be >= 0, top_p in (0, 1] and max_new_tokens >= 1")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class EpisodeLimits:
    """Bounds of one multi-turn episode (an episode that hits one ends and says which), and how its
    prompt lists the tools."""

    max_user_turns: int = doc(10, "User turns played; later turns are not reached.")
    max_calls_per_turn: int = doc(20, "Tool calls in one user turn.")
    max_context_tokens: int = doc(8192, "Whole episode length in tokens (prompt, outputs, observations).")
    max_backend_errors: int = doc(2, "Consecutive failed generations before the episode ends.")
    tool_docs: str = doc("full", "How the system prompt lists the tools: full (BFCL's JSON function docs) or "
                                 "signatures (one line per function: arguments with types, its description).")
    call_limit_s: float = doc(10.0, "Wall-clock limit of one tool call, in seconds: calls run in a tool-host "
                                    "process, restarted when one runs past it (0: in the service's own process, "
                                    "unbounded).")
    call_memory_mb: int = doc(1024, "Address space of the tool-host process, in MiB; an allocation past it fails "
                                    "that call.")

    def __post_init__(self) -> None:
        for name in ("max_user_turns", "max_calls_per_turn", "max_context_tokens", "max_backend_errors"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be at least 1")
        if self.call_limit_s < 0 or self.call_memory_mb < 256:
            raise ConfigError(f"call_limit_s={self.call_limit_s} must be >= 0 (0: unbounded) and "
                              f"call_memory_mb={self.call_memory_mb} at least 256")
        if self.tool_docs not in TOOL_DOCS:
            raise ConfigError(f"tool_docs={self.tool_docs!r}: choose one of {', '.join(TOOL_DOCS)}")


@dataclass(frozen=True)
class EvalConfig:
    """What to evaluate on."""

    env: str = doc("bfcl", "Environment.")
    split: str = doc("test", "Split of the tasks: test (held out), train or all.")
    limit: int = doc(0, "Evaluate only the first N tasks of the split (0: all).")
    in_flight: int = doc(16, "Episodes run at once; their generations are batched.")
    max_new_tokens: int = doc(256, "New tokens per generation.")

    def __post_init__(self) -> None:
        if self.env != "bfcl":
            raise ConfigError(f"env={self.env!r}: only bfcl is available")
        if self.split not in ("test", "train", "all"):
            raise ConfigError(f"split={self.split!r}: choose test, train or all")
        if self.limit < 0 or self.in_flight < 1 or self.max_new_tokens < 1:
            raise ConfigError("limit must be >= 0, in_flight and max_new_tokens >= 1")


class EvalSettings(Settings):
    """Everything `coevolve eval` reads: `EVAL_<FIELD>`, then `<FIELD>`, or a flag."""

    eval: EvalConfig
    backend: BackendConfig
    limits: EpisodeLimits

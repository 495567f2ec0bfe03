"""The learner's training settings: one frozen dataclass, layered like every service's config.

`assemble(LearnerSettings, "learner")` reads `LEARNER_LR`, then `LR`, then the default
(services/runtime/config.py); the learner's one `seed` is BackendConfig's (engine, sampling, torch).
Defaults are the paper's where it gives one (clip 0.20 / 0.28, KL beta 1e-3 is its `paper` preset;
beta 0 here so no reference model is loaded unless asked) and CPU-sized otherwise.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from coevolve.services.agent.config import BackendConfig, EpisodeLimits
from coevolve.services.agent.precision import AUTOCASTS
from coevolve.services.envs.config import SeedPoolConfig
from coevolve.services.fleet.config import FleetConfig
from coevolve.services.runtime.config import ConfigError, ServiceConfig, Settings, doc

REWARDS = ("binary", "partial", "shaped")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")


@dataclass(frozen=True)
class GRPOConfig:
    """Optimizer, loss and trainer settings of a GRPO training step."""

    lr: float = doc(1e-6, "AdamW learning rate (the paper's 1e-6).")
    weight_decay: float = doc(0.0, "AdamW weight decay.")
    clip_low: float = doc(0.20, "Lower clip range: the ratio is clipped at 1 - clip_low.")
    clip_high: float = doc(0.28, "Upper clip range: the ratio is clipped at 1 + clip_high.")
    kl_beta: float = doc(0.0, "Weight of the k3 KL penalty against the frozen reference; 0 loads no reference.")
    loss_agg: str = doc("token-mean", "Loss aggregation: token-mean, seq-mean-token-sum or seq-mean-token-mean.")
    reward: str = doc("partial", "Rollout reward: binary (task success, the paper's), partial (share of turns passed) "
                       "or shaped (3/4 partial, 1/4 the share of the reference's tools called).")
    adv_eps: float = doc(1e-6, "Added to a group's reward std before dividing.")
    temperature: float = doc(1.0, "Rollout sampling temperature; logits are divided by it before log-probs.")
    max_grad_norm: float = doc(1.0, "Clip the global gradient norm to this; 0 disables clipping.")
    micro_batch_size: int = doc(4, "Sequences per forward/backward (per pack with shared_prefix); gradients "
                                "accumulate over a step's batch.")
    shared_prefix: bool = doc(True, "Train rollouts with the same prompt as one packed row that holds the prompt "
                              "once (exact; packing.py); off trains each rollout as its own padded row.")
    gradient_checkpointing: bool = doc(False, "Recompute each layer's activations in the backward pass instead of "
                                       "keeping them (about a third more compute, far less memory on long episodes).")
    autocast: str = doc("off", "Mixed precision of the forward and backward: off (float32), bf16 (torch.autocast; "
                        "weights and optimizer stay float32), or auto (bf16 where the device computes it "
                        "natively, else off).")
    deepspeed_config: str = doc("", "Path of a DeepSpeed JSON config (ZeRO stage 0-3); empty trains with plain torch "
                                "(one rank) or FSDP2 (several).")
    max_policy_lag: int = doc(0, "Bounded-staleness asynchronous steps: the rollouts of the next L steps are "
                              "generated while a step trains and pushes, and no rollout trained on comes from a "
                              "policy more than L versions old; the loss is then decoupled PPO (grpo.py). 0 is "
                              "synchronous: generate, train, push, in turn.")
    behaviour_weight_cap: float = doc(2.0, "max_policy_lag >= 1: the behaviour importance weight "
                                      "pi_prox / pi_behav is truncated at this value.")
    lora_rank: int = doc(0, "LoRA rank through peft; 0 trains every weight.")
    lora_alpha: int = doc(16, "LoRA alpha (scale alpha / rank).")
    lora_targets: str = doc("q_proj,k_proj,v_proj,o_proj", "Comma-separated module names LoRA adapts.")

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"lr must be positive (got {self.lr}); the paper uses 1e-6")
        if not 0 < self.clip_low < 1 or self.clip_high <= 0:
            raise ConfigError(f"clip_low must be in (0, 1) and clip_high positive (got {self.clip_low}, "
                              f"{self.clip_high}); the paper uses 0.20 and 0.28")
        for name in ("kl_beta", "weight_decay", "max_grad_norm"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0 (got {getattr(self, name)})")
        if self.loss_agg not in LOSS_AGG_MODES:
            raise ConfigError(f"loss_agg={self.loss_agg!r} is unknown; use one of {', '.join(LOSS_AGG_MODES)}")
        if self.reward not in REWARDS:
            raise ConfigError(f"reward={self.reward!r} is unknown; use one of {', '.join(REWARDS)}")
        if self.adv_eps <= 0 or self.temperature <= 0:
            raise ConfigError("adv_eps and temperature must be positive; sample with temperature > 0 to train")
        if self.autocast not in AUTOCASTS:
            raise ConfigError(f"autocast={self.autocast!r}: choose {', '.join(AUTOCASTS)}")
        if self.max_policy_lag < 0 or self.behaviour_weight_cap < 1:
            raise ConfigError(f"max_policy_lag must be >= 0 (0 = synchronous; got {self.max_policy_lag}) and "
                              f"behaviour_weight_cap >= 1 (got {self.behaviour_weight_cap})")
        if self.micro_batch_size < 1:
            raise ConfigError(f"micro_batch_size must be at least 1 (got {self.micro_batch_size})")
        if self.lora_rank < 0 or self.lora_alpha <= 0:
            raise ConfigError("lora_rank must be >= 0 (0 = off) and lora_alpha positive")
        if self.lora_rank and not self.lora_target_modules:
            raise ConfigError("lora_targets is empty; name the modules to adapt, e.g. q_proj,v_proj")
        if self.deepspeed_config:
            read_deepspeed_config(self.deepspeed_config)

    @property
    def lora_target_modules(self) -> list[str]:
        return [name.strip() for name in self.lora_targets.split(",") if name.strip()]


def read_deepspeed_config(path: str) -> dict:
    """Parse a DeepSpeed JSON config and check what this learner supports (ZeRO stages 0-3)."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"deepspeed_config {path!r} is not a file; give a DeepSpeed JSON config or leave it empty")
    try:
        config = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"deepspeed_config {path!r} is not valid JSON: {err}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"deepspeed_config {path!r} must hold a JSON object")
    stage = zero_stage(config)
    if stage not in (0, 1, 2, 3):
        raise ConfigError(f"ZeRO stage {stage!r} in {path!r} is not a ZeRO stage; use 0, 1, 2 or 3")
    return config


def zero_stage(settings: dict) -> int:
    """The ZeRO stage a DeepSpeed config names (0 without a `zero_optimization` section)."""
    return settings.get("zero_optimization", {}).get("stage", 0)


@dataclass(frozen=True)
class RanksConfig:
    """Training ranks (services/learner/ranks/): above one, `coevolve learner` starts them with torchrun."""

    world_size: int = doc(1, "Training ranks in all. Above 1 the step's batch is split across them and the policy "
                          "is sharded: FSDP2, or DeepSpeed when deepspeed_config names a file (ZeRO-3 allowed).")
    nnodes: int = doc(1, "Nodes the ranks run on (torchrun --nnodes); world_size / nnodes ranks on each.")
    node_rank: int = doc(0, "This node's index, 0..nnodes-1 (torchrun --node-rank); node 0 holds rank 0.")
    rdzv_endpoint: str = doc("", "host:port of torchrun's rendezvous, the same on every node; empty: this "
                             "machine alone, meeting on loopback.")
    max_restarts: int = doc(0, "torchrun --max-restarts: times the whole group is restarted after a rank fails; a "
                            "restarted group resumes from the latest checkpoint.")

    def __post_init__(self) -> None:
        if self.world_size < 1 or self.nnodes < 1 or self.max_restarts < 0:
            raise ConfigError("world_size and nnodes must be at least 1, max_restarts >= 0")
        if self.world_size % self.nnodes:
            raise ConfigError(f"world_size={self.world_size} does not split over nnodes={self.nnodes}: use a "
                              "multiple of nnodes (the same number of ranks on every node)")
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"node_rank={self.node_rank} must be in 0..{self.nnodes - 1}")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ConfigError(f"nnodes={self.nnodes} needs rdzv_endpoint (host:port every node reaches, e.g. node "
                              "0's address and port 29400)")

    @property
    def per_node(self) -> int:
        return self.world_size // self.nnodes


@dataclass(frozen=True)
class WarmupConfig:
    """Supervised warm-up on the seed tasks' reference calls before GRPO (services/learner/loop/warmup.py)."""

    warmup_steps: int = doc(0, "Optimizer steps of cross-entropy on reference episodes before the first GRPO "
                            "step, teaching a small model the call format; 0 skips the warm-up.")
    warmup_lr: float = doc(1e-4, "AdamW learning rate of the warm-up.")
    warmup_batch: int = doc(4, "Reference episodes (or windows) per warm-up step.")
    warmup_window: int = doc(0, "Train on each reply with only this many tokens before it (a cheap warm-up for "
                             "a model too small to use the long prompt); 0 trains on whole episodes.")

    def __post_init__(self) -> None:
        if self.warmup_steps < 0 or self.warmup_window < 0 or self.warmup_batch < 1 or self.warmup_lr <= 0:
            raise ConfigError("warmup_steps and warmup_window must be >= 0, warmup_batch at least 1 and "
                              "warmup_lr positive")


SAMPLERS = ("streaming", "static")


@dataclass(frozen=True)
class SamplerConfig:
    """Which tasks each step trains on: the seed split plus the validated tasks of `coevolve.tasks`."""

    sampler: str = doc("streaming", "streaming (new tasks join between steps) or static (read coevolve.tasks "
                       "for static_wait_s before step 1, then freeze: the paper's static ablation).")
    synthetic_share: float = doc(-1.0, "Share of each batch drawn from synthesized tasks when there are any; "
                                 "-1 (default, the paper's mixing) draws uniformly over the whole pool.")
    recency_half_life: float = doc(0.0, "Halve a synthesized task's sampling weight every this many steps "
                                   "after it joined; 0 keeps every task's weight equal.")
    static_wait_s: float = doc(0.0, "static: seconds to read coevolve.tasks before training starts, at most.")
    static_tasks: int = doc(0, "static: the tasks the static exploration proposes (the explorer's count); the "
                               "wait ends once each has a verdict of this run's step 0. 0 waits static_wait_s.")
    inherit_tasks: bool = doc(False, "Take in the tasks every run validated on this broker (an earlier run's "
                                     "too); false: only this run's own loop's.")
    fresh_first: bool = doc(False, "A synthesized task never drawn takes a batch slot before the mixing draws "
                                   "the rest (oldest first, at most B a step): each validated task is trained on "
                                   "at the first step after it joins.")

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ConfigError(f"sampler={self.sampler!r}: choose one of {', '.join(SAMPLERS)}")
        if not (self.synthetic_share == -1 or 0 <= self.synthetic_share <= 1):
            raise ConfigError(f"synthetic_share={self.synthetic_share}: use a share in [0, 1], or -1 to draw "
                              "uniformly over the whole pool")
        if self.recency_half_life < 0 or self.static_wait_s < 0 or self.static_tasks < 0:
            raise ConfigError("recency_half_life, static_wait_s and static_tasks must be >= 0")


@dataclass(frozen=True)
class LearnerConfig(ServiceConfig):
    """Run, batch shape, rollouts, checkpoints and evaluation of `coevolve learner`."""

    workdir: Path = doc(Path(".coevolve/learner"), "Where checkpoints are kept.")
    run_id: str = doc("", "Run id stamped on every event; empty: run-<UTC time> (a resumed run keeps its own).")
    resume: bool = doc(False, "Continue the run in workdir from its latest checkpoint (fresh if there is none).")
    steps: int = doc(10, "Training steps to complete (numbered 1..steps); 0 evaluates the starting policy "
                         "once, as step 0, and trains nothing.")
    batch_tasks: int = doc(2, "Tasks per step (B).")
    group_size: int = doc(4, "Rollouts per task (K).")
    eval_every: int = doc(0, "Evaluate greedily every this many steps and after the last; 0 never.")
    eval_split: str = doc("test", "Split evaluated: test (held out), train or all.")
    eval_tasks: int = doc(0, "Tasks of the split evaluated; 0 evaluates all.")
    eval_subjects: bool = doc(False, "Each evaluation also runs, greedily, every seed task of the pool and the "
                                     "synthesized tasks whose signals led to another (split `subjects`): a weakness's "
                                     "subject scored before and after its tasks were trained on (summary.json's "
                                     "repair).")
    eval_at_start: bool = doc(False, "Evaluate the starting policy before step 1 as well, as step 0 (the zero-shot "
                                     "point of the held-out curve, and the `before` of repair).")
    checkpoint_every: int = doc(1, "Checkpoint every this many steps (and always at the end or on stop).")
    keep_checkpoints: int = doc(2, "Checkpoints kept in workdir (older ones are deleted); 0 keeps all.")
    dynamic_sampling: bool = doc(False, "Replace groups whose K rewards are all equal with draws of tasks the step has "
                                 "not rolled out (DAPO).")
    max_resample: int = doc(2, "Dynamic sampling: rounds of redraws per step at most.")
    in_flight: int = doc(64, "Episodes run at once; their generations are batched.")
    max_new_tokens: int = doc(256, "New tokens per generation of a rollout or an evaluation episode.")

    def __post_init__(self) -> None:
        for name in ("batch_tasks", "group_size", "checkpoint_every", "in_flight", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be at least 1")
        if self.group_size < 2:
            raise ConfigError(f"group_size={self.group_size}: GRPO's advantage compares a task's rollouts with "
                              "each other, and a group of one has advantage 0 and trains nothing; use K >= 2")
        for name in ("steps", "eval_every", "eval_tasks", "max_resample", "keep_checkpoints"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 0")
        if self.eval_split not in ("test", "train", "all"):
            raise ConfigError(f"eval_split={self.eval_split!r}: choose test, train or all")


def rollout_backend(backend: str, world_size: int) -> str:
    """The rollout backend a learner runs for `backend`: itself, except `vllm` with several ranks, which runs
    as one local `vllm serve` process (`vllm-server`, the fleet's defaults): an in-process engine would
    join the training ranks' process group (vLLM builds its own groups from torch's default one)."""
    return "vllm-server" if backend == "vllm" and world_size > 1 else backend


class LearnerSettings(Settings):
    """Everything `coevolve learner` reads, each key `LEARNER_<FIELD>` or `learner.<field>` in a preset."""

    refused: ClassVar[dict[str, str]] = {key: "the learner updates its own rollout policy (backend vllm, "
                                              "transformers or vllm-server, whose settings are the fleet's); "
                                              "the openai backend's settings do not apply"
                                         for key in ("base_url", "api_key_env", "request_timeout_s", "max_retries",
                                                     "concurrency")}

    learner: LearnerConfig
    grpo: GRPOConfig
    sampler: SamplerConfig
    seeds: SeedPoolConfig
    warmup: WarmupConfig
    backend: BackendConfig
    fleet: FleetConfig
    ranks: RanksConfig
    limits: EpisodeLimits

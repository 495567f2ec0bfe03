"""Child process of test_learner_deepspeed: train plain torch and DeepSpeed side by side, print JSON.

DeepSpeed joins a torch.distributed process group and sets rendezvous variables in the process; a
child keeps both out of the test process (and out of other in-process engines such as vLLM).
"""
import json
import sys
import tempfile

from coevolve.services.learner.loop import checkpoint as ckpt
from coevolve.services.learner.config import GRPOConfig
from coevolve.services.learner.trainer.build import build_trainer
from bench.shapes import random_llama
from tests.unit.test_learner_engine import SMALL, make_batch, max_diff, weights


def resumed_weight_diff(ds, config: GRPOConfig, steps: int) -> float:
    """Checkpoint `ds`, restore into a fresh engine (the starting weights, so the same KL reference), take
    one more update with both, and return the largest weight difference between them: 0 when the trained
    weights and the optimizer's moments came back."""
    with tempfile.TemporaryDirectory() as workdir:
        ckpt.save_checkpoint(workdir, ds, step=steps, run_id="run-ds", policy_version=steps, sampler={}, config={})
        resumed = build_trainer(random_llama("tiny", seed=0, **SMALL), config)
        ckpt.restore_trainer(resumed, ckpt.latest_checkpoint(workdir))
    assert resumed.updates == ds.updates
    for engine in (ds, resumed):
        engine.update(make_batch(seed=steps))
    return max_diff(weights(ds), weights(resumed))


def main(ds_file: str, steps: int, micro_batch: int, kl_beta: float) -> None:
    common = dict(lr=1e-3, micro_batch_size=micro_batch, kl_beta=kl_beta, max_grad_norm=1.0)
    plain = build_trainer(random_llama("tiny", seed=0, **SMALL), GRPOConfig(**common))
    ds = build_trainer(random_llama("tiny", seed=0, **SMALL), GRPOConfig(**common, deepspeed_config=ds_file))
    runs = [(plain.update(make_batch(seed=s)), ds.update(make_batch(seed=s))) for s in range(steps)]
    trained = max_diff(weights(plain), weights(ds))
    print(json.dumps({
        "trainer": type(ds).__name__, "stage": ds.ds.zero_optimization_stage(),
        "lr": ds.optimizer.param_groups[0]["lr"], "torch": [a for a, _ in runs], "deepspeed": [b for _, b in runs],
        "max_weight_diff": trained, "same_names": set(ds.state_dict()) == set(plain.state_dict()),
        "resumed_weight_diff": resumed_weight_diff(ds, GRPOConfig(**common, deepspeed_config=ds_file), steps),
    }))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))

"""Multi-rank learner on CPU ranks: update time at 1 and 2 ranks, the collectives' share, memory per rank.

    python bench/bench_ranks.py [--parts speed,memory] [--runs NAME,...] [--shape smollm2-135m]
                                [--repeats 3] [--wait-busy 0.3] [--out FILE]   (or python -m bench.bench_ranks)

Each engine runs in its own torchrun group (`--standalone`, gloo, CPU) whose ranks are processes of this
file (`--rank-child`): every rank builds the same random-weight model (`shapes.random_llama`, float32),
rank 0 drives the updates as the learner service does (`ranks.Driver`; the others `ranks.follow`), and
each rank writes what it measured. The batch is fixed: B = 4 prompts of 512 tokens x K = 4 rollouts
of 64-192 generated tokens each (ids drawn from the model's vocabulary), shared-prompt packing on,
micro-batch 4 (one pack per prompt: 4 micro-batches, 2 per rank at 2 ranks), AdamW, KL off, float32.

Per engine: one warm-up update, in which the live tensors are counted (each storage once) right before
the optimizer step (weights, gradients) and after it (AdamW's state, created by the first step); then
`repeats` timed updates; then, with several ranks, one update under torch.profiler (CPU activities).

- speed (runs torch-1, fsdp2-1, fsdp2-2): plain torch in one process (TorchTrainer), FSDP2 on 1 rank and
  on 2 ranks. torchrun gives each of several ranks one thread, a single process keeps torch's default
  (one per core), so both world sizes use the machine's cores. Reported: the median update seconds on
  rank 0; each rank's `engine.rank_times` (training = forward and backward, reduce = the optimizer step
  and the collectives after the backward); the training thread's time off the CPU (wall minus its
  CPU time: waiting for the other rank, or descheduled); and, for the profiled update, the seconds
  with a collective in flight: the union over all threads of the events whose names contain
  all_gather, allgather, reduce_scatter, allreduce, all_reduce or broadcast (their names are printed).
  gloo's own events run on its worker threads from the call to completion, waiting for the other
  rank included, so this counts the wait for a slower rank and any overlap with computation.
- memory (runs fsdp2-1, fsdp2-2, zero2-1, zero2-2, zero3-1, zero3-2): FSDP2, DeepSpeed ZeRO-2 and ZeRO-3
  on 1 and 2 ranks (configs `{"zero_optimization": {"stage": N}}`, no "optimizer" section, so torch's
  AdamW; the runs on 1 rank are only there for the fit below and may use --repeats 1). Per rank: peak RSS
  (VmHWM) minus the RSS right before the model is built, over the whole run and within a timed update
  (VmHWM reset through /proc/self/clear_refs before each update), and the bytes of the tensors the
  rank holds, by kind: weights (the local shard where sharded), gradients, AdamW's moments, the
  float32 master copies DeepSpeed steps, DeepSpeed's gradient buckets (allocated with torch.empty: on
  a CPU only the pages written count in RSS) and the rest. Bytes per parameter divide these by the
  model's parameter count. Kind by kind, the runs at 1 and 2 ranks give bytes per parameter per rank
  as replicated + sharded / W (solved from b(1) and b(2), the mean over the ranks), and from that the
  benchmark extrapolates GiB per rank for the weights, gradients and AdamW state of Qwen2.5-7B (7.6B
  parameters), Qwen3-4B (4.0B) and Qwen3-30B-A3B (30.5B) on 8, 16 and 32 ranks (DeepSpeed's gradient
  buckets added as measured; activations not included). DeepSpeed's first start on a machine
  JIT-builds its CPU communication op (about a minute, cached in ~/.cache/torch_extensions).

Medians and all runs are printed and written as JSON to --out; runs already in that file (same shape)
from earlier invocations are kept, so `--runs` can take the engines one at a time (SmolLM2's shape takes
3-5 minutes per engine on 2 cores). Before each engine's run the benchmark waits (up to --wait-max s)
until other processes keep fewer than --wait-busy cores busy; during the run it measures how many they
kept busy (/proc/stat's busy time less this benchmark's processes' CPU time: "others", in cores).
"""
from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a plain script: `bench` is importable from the repository root
    sys.path.insert(0, str(ROOT))

from bench.common import machine  # noqa: E402

UNSET = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DS_ACCELERATOR",
         "OMP_NUM_THREADS")  # left to torchrun and the engines in each run
COLLECTIVES = ("all_gather", "allgather", "reduce_scatter", "allreduce", "all_reduce", "broadcast")
RUNS = {  # name: (engine, world size, parts)
    "torch-1": ("torch", 1, ("speed",)),
    "fsdp2-1": ("fsdp", 1, ("speed", "memory")),
    "fsdp2-2": ("fsdp", 2, ("speed", "memory")),
    "zero2-1": ("zero2", 1, ("memory",)),
    "zero2-2": ("zero2", 2, ("memory",)),
    "zero3-1": ("zero3", 1, ("memory",)),
    "zero3-2": ("zero3", 2, ("memory",)),
}
FITS = {"FSDP2": ("fsdp2-1", "fsdp2-2"), "ZeRO-3": ("zero3-1", "zero3-2"), "ZeRO-2": ("zero2-1", "zero2-2")}
MODELS = {"Qwen2.5-7B": 7.6e9, "Qwen3-4B": 4.0e9, "Qwen3-30B-A3B": 30.5e9}  # total parameters (30B-A3B: 3.3B active)
GPUS = (8, 16, 32)
GiB = 2**30
MARKER = "bench_ranks::update"
OWNER_KINDS = {  # DeepSpeed ZeRO attributes (0.19) holding what the parameters and torch's AdamW do not
    "single_partition_of_fp32_groups": "master_weights", "fp32_partitioned_groups_flat": "master_weights",
    "averaged_gradients": "gradients", "all_grad_tensors": "gradients", "grad_partitions_flat_buffer": "gradients",
    "ipg_buckets": "gradient_buckets",
}
KINDS = ("parameters", "gradients", "optimizer_state", "master_weights", "gradient_buckets", "other")


# ---------------------------------------------------------------------------------------------------
# One rank (under torchrun)

def status(field: str) -> int:
    """A /proc/self/status field (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak() -> None:
    """Start VmHWM again from the current RSS."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def grpo_batch(vocab: int, tasks: int = 4, k: int = 4, prompt: int = 512, low: int = 64, high: int = 192):
    """`tasks` prompts of `prompt` tokens, `k` rollouts each of low..high generated tokens, advantages +-."""
    from coevolve.services.learner.trainer.batch import TrainSequence
    import torch

    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(tasks):
        shared = torch.randint(0, vocab, (prompt,), generator=gen).tolist()
        for i in range(k):
            n = int(torch.randint(low, high + 1, (1,), generator=gen))
            ids = shared + torch.randint(0, vocab, (n,), generator=gen).tolist()
            mask = [0] * prompt + [1] * n
            logprobs = [-2.0 - float(torch.rand(1, generator=gen)) if m else 0.0 for m in mask]
            out.append(TrainSequence(ids, mask, logprobs, advantage=(1.0, -1.0, 0.5, -0.5)[i % 4]))
    return out


def _local(t):
    from torch.distributed.tensor import DTensor

    return t._local_tensor if isinstance(t, DTensor) else t


def _key(t):
    """(storage address, bytes) of a tensor's storage; None for one without memory of its own."""
    t = _local(t)
    if t.device.type == "meta" or t.is_sparse or t.is_nested:
        return None
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    if storage.nbytes() == 0 or storage.data_ptr() == 0:
        return None
    return storage.data_ptr(), storage.nbytes()


def torch_optimizer(engine):
    """The torch optimizer underneath (DeepSpeed wraps it)."""
    import torch

    opt = engine.optimizer
    while not isinstance(opt, torch.optim.Optimizer) and hasattr(opt, "optimizer"):
        opt = opt.optimizer
    return opt


def _tensors(value, depth: int = 3):
    """The tensors in `value`, looking into lists, tuples and dicts `depth` levels deep."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif depth and isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item, depth - 1)
    elif depth and isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item, depth - 1)
    elif depth and type(value).__module__.startswith("deepspeed") and not isinstance(value, torch.nn.Module):
        for item in list(getattr(value, "__dict__", {}).values()):  # e.g. ZeRO's gradient bucket objects
            yield from _tensors(item, depth - 1)


def owners(engine) -> dict[tuple, str]:
    """Storage -> the engine attribute holding it (`optimizer.<name>`, `deepspeed.<name>`), for naming the
    buffers DeepSpeed keeps outside the parameters and the torch optimizer."""
    found: dict[tuple, str] = {}
    roots = {"optimizer": engine.optimizer}
    if hasattr(engine, "ds"):
        roots["deepspeed"] = engine.ds
    for root, obj in roots.items():
        for attr, value in list(getattr(obj, "__dict__", {}).items()):
            for tensor in _tensors(value):
                key = _key(tensor)
                if key is not None:
                    found.setdefault(key, f"{root}.{attr}")
    return found


def held_bytes(engine) -> dict:
    """Bytes of the live tensors of this process, each storage counted once, by kind; the storages of kind
    `other` also by the engine attribute that holds them."""
    import torch

    kinds: dict[tuple, str] = {}

    def mark(tensor, kind):
        key = _key(tensor) if isinstance(tensor, torch.Tensor) else None
        if key is not None and key not in kinds:
            kinds[key] = kind

    module = engine.policy_module
    for p in module.parameters():
        mark(p, "parameters")
        if getattr(p, "ds_tensor", None) is not None:  # ZeRO-3: this rank's partition
            mark(p.ds_tensor, "parameters")
    for p in module.parameters():
        if p.grad is not None:
            mark(p.grad, "gradients")
    opt = torch_optimizer(engine)
    for state in opt.state.values():
        for value in state.values():
            mark(value, "optimizer_state")
    for group in opt.param_groups:
        for p in group["params"]:
            mark(p, "master_weights")  # DeepSpeed's float32 partitions (the model's own ones are marked above)
            if p.grad is not None:
                mark(p.grad, "gradients")
    gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.Tensor):
                    mark(obj, "other")
            except Exception:  # noqa: BLE001 (lazy modules raise on isinstance)
                continue
    out = dict.fromkeys(KINDS, 0)
    named = owners(engine)
    other: dict[str, int] = {}
    for key, kind in kinds.items():
        if kind == "other":
            owner = named.get(key, "unattributed")
            other[owner] = other.get(owner, 0) + key[1]
            kind = OWNER_KINDS.get(owner.split(".", 1)[-1], "other")
        out[kind] += key[1]
    out["total"] = sum(out.values())
    return {**out, "other_by_owner": dict(sorted(other.items(), key=lambda kv: -kv[1]))}


def merged(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def collectives(prof) -> dict:
    """Seconds of the profiled update with a collective in flight: the union of the collectives' events over
    all threads (gloo's events run on its worker threads from the call to completion, waiting for the
    other rank included), and over the thread that ran the update alone (the one with the
    `bench_ranks::update` marker: issuing the calls, FSDP's gather buffer copies)."""
    main_thread = next(e.thread for e in prof.events() if e.name == MARKER)
    names: dict[str, list[float]] = {}
    spans, main_spans = [], []
    for event in prof.events():
        low = event.name.lower()
        if not any(c in low for c in COLLECTIVES):
            continue
        span = (event.time_range.start / 1e6, event.time_range.end / 1e6)
        entry = names.setdefault(re.sub(r"layers\.\d+", "layers.N", event.name), [0, 0.0])
        entry[0] += 1
        entry[1] += span[1] - span[0]
        spans.append(span)
        if event.thread == main_thread:
            main_spans.append(span)
    threads = sorted({e.thread for e in prof.events()})
    return {"seconds_any_thread": merged(spans), "seconds_main_thread": merged(main_spans),
            "events": {name: {"count": c, "seconds": s} for name, (c, s) in sorted(names.items())},
            "threads": len(threads), "main_thread_events": sum(1 for e in prof.events() if e.thread == main_thread)}


class Probe:
    """Wraps a rank's `update` (`runner`: the engine, split between the ranks) and the engine's optimizer step
    to time, profile and count memory per update."""

    def __init__(self, runner, engine, rank: int, plan: list[str]):
        self.engine, self.rank, self.plan, self.records = engine, rank, plan, []
        self._update, self._step = runner.update, engine.optimizer_step
        runner.update, engine.optimizer_step = self.update, self.step
        self.kind = ""
        self.pre_step: dict | None = None

    def step(self):
        if self.kind == "warmup":
            self.pre_step = held_bytes(self.engine)
        return self._step()

    def update(self, batch):
        import torch

        self.kind = self.plan[len(self.records)] if len(self.records) < len(self.plan) else "extra"
        gc.collect()
        rss = status("VmRSS")
        reset_peak()
        prof = None
        if self.kind == "profile":
            from torch.profiler import ProfilerActivity, profile

            prof = profile(activities=[ProfilerActivity.CPU])
            prof.__enter__()
        started, cpu = time.perf_counter(), time.thread_time()
        with torch.profiler.record_function(MARKER):
            metrics = self._update(batch)
        seconds, cpu = time.perf_counter() - started, time.thread_time() - cpu
        if prof is not None:
            prof.__exit__(None, None, None)
        record = {"kind": self.kind, "seconds": seconds, "thread_cpu_seconds": cpu,
                  "step_seconds": metrics["step_seconds"],
                  "loss": metrics["loss"], "grad_norm": metrics["grad_norm"],
                  "rss_before": rss, "peak": status("VmHWM"), "rss_after": status("VmRSS"),
                  "rank_times": self.engine.rank_times}
        if prof is not None:
            record["collectives"] = collectives(prof)
        if self.kind == "warmup":
            record["held_pre_step"] = self.pre_step
            record["held_after"] = held_bytes(self.engine)
        self.records.append(record)
        print(f"  rank {self.rank}: {self.kind} update {seconds:.1f} s, peak RSS "
              f"{record['peak'] / GiB:.2f} GiB", flush=True)
        return metrics


def rank_child(args) -> None:
    import torch
    import torch.distributed as dist

    from coevolve.services.learner.config import GRPOConfig
    from coevolve.services.learner.trainer.build import build_trainer, wrap_policy
    from coevolve.services.learner.ranks.driver import Driver, follow
    from coevolve.services.learner.ranks.group import Ranks, init_group
    from coevolve.services.learner.ranks.split import split
    from bench.shapes import SHAPES, random_llama

    ranks = Ranks.from_env()
    init_group(ranks)
    if args.rank_child == "fsdp" and not ranks.many:  # FSDP2 on one rank still needs a group
        dist.init_process_group("gloo")
    batch = grpo_batch(SHAPES[args.shape]["vocab_size"])
    gc.collect()
    mem = {"rss_before_build": status("VmRSS")}
    reset_peak()
    started = time.perf_counter()
    model = random_llama(args.shape, seed=0)
    parameters = sum(p.numel() for p in model.parameters())
    mem["rss_model"] = status("VmRSS")
    deepspeed = args.deepspeed_config if args.rank_child.startswith("zero") else ""
    config = GRPOConfig(lr=1e-6, micro_batch_size=4, shared_prefix=True, kl_beta=0.0, deepspeed_config=deepspeed)
    if args.rank_child == "fsdp":
        from coevolve.services.learner.trainer.fsdp_trainer import FSDPTrainer

        engine = FSDPTrainer(wrap_policy(model, config), config)
    else:
        engine = build_trainer(model, config)
    del model
    gc.collect()
    mem.update(rss_engine=status("VmRSS"), peak_build=status("VmHWM"), build_seconds=time.perf_counter() - started)
    plan = ["warmup"] + ["timed"] * args.repeats + (["profile"] if ranks.many else [])
    runner = split(engine)
    probe = Probe(runner, engine, ranks.rank, plan)
    if ranks.driver:
        driver = Driver(runner)
        for _ in plan:
            driver.update(batch)
        driver.close()
    else:
        follow(runner)
        if dist.is_initialized():
            dist.destroy_process_group()
    out = {"rank": ranks.rank, "world": ranks.world_size, "engine": type(engine).__name__,
           "threads": torch.get_num_threads(), "parameters": parameters, "memory": mem, "updates": probe.records,
           "tokens": sum(len(s.token_ids) for s in batch), "sequences": len(batch),
           "loss_tokens": sum(s.loss_tokens for s in batch)}
    Path(args.dir, f"rank{ranks.rank}.json").write_text(json.dumps(out))


# ---------------------------------------------------------------------------------------------------
# The orchestrator

def busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (all cores), from /proc/stat."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def run_engine(name: str, args, workdir: Path) -> dict:
    import resource

    engine, world, _ = RUNS[name]
    folder = workdir / name
    folder.mkdir(parents=True, exist_ok=True)
    ds = ""
    if engine.startswith("zero"):
        ds = str(workdir / f"{engine}.json")
        Path(ds).write_text(json.dumps({"zero_optimization": {"stage": int(engine[-1])}}))
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
               "-m", "bench.bench_ranks", "--rank-child", engine, "--dir", str(folder), "--shape", args.shape,
               "--repeats", str(args.repeats), "--deepspeed-config", ds]
    load = os.getloadavg()[0]
    busy, children = busy_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    tail: collections.deque[str] = collections.deque(maxlen=300)
    with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        timer = threading.Timer(args.timeout, proc.kill)
        timer.start()
        for line in proc.stdout:  # the ranks' progress lines; the rest only if the run fails
            if "Warning" in line or line.startswith("  return func("):
                continue  # deprecation notices of every collective call
            tail.append(line)
            if line.startswith("  rank "):
                print(line, end="", flush=True)
        returncode = proc.wait()
        timer.cancel()
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    ours = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
    others = max(0.0, busy_seconds() - busy - ours)
    if returncode != 0:
        sys.exit(f"{name} failed (exit {returncode}):\n{''.join(tail)[-6000:]}")
    ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(world)]
    print(f"{name}: {wall:.0f} s wall, load average {load:.1f} at start, other processes kept "
          f"{others / wall:.2f} cores busy meanwhile", flush=True)
    return {"engine": engine, "world": world, "date": time.strftime("%Y-%m-%d"), "wall_seconds": wall,
            "load_at_start": load,
            "other_cores_busy": others / wall, "ranks": ranks}


def summarize(run: dict) -> dict:
    """The figures of one engine's run."""
    ranks = run["ranks"]
    params = ranks[0]["parameters"]
    timed = [u for u in ranks[0]["updates"] if u["kind"] == "timed"]
    out: dict = {"world": run["world"], "engine": ranks[0]["engine"], "threads_per_rank": ranks[0]["threads"],
                 "parameters": params, "date": run["date"], "load_at_start": run["load_at_start"],
                 "other_cores_busy": run["other_cores_busy"], "wall_seconds": run["wall_seconds"],
                 "update_seconds": statistics.median(u["seconds"] for u in timed),
                 "update_seconds_runs": [u["seconds"] for u in timed],
                 "warmup_seconds": ranks[0]["updates"][0]["seconds"], "loss": timed[0]["loss"]}
    out["off_cpu_seconds"] = [statistics.median(u["seconds"] - u["thread_cpu_seconds"] for u in rank["updates"]
                                                if u["kind"] == "timed") for rank in ranks]
    out["rank_times"] = [
        {part: statistics.median(u["rank_times"][r][part] for u in timed) for part in ("training", "reduce")}
        for r in range(run["world"])]
    out["collectives"] = []
    for rank in ranks:
        profiled = next((u for u in rank["updates"] if u["kind"] == "profile"), None)
        if profiled is None:
            continue
        c = profiled["collectives"]
        out["collectives"].append({
            "update_seconds": profiled["seconds"],
            "seconds_main_thread": c["seconds_main_thread"], "seconds_any_thread": c["seconds_any_thread"],
            "share_main_thread": c["seconds_main_thread"] / profiled["seconds"],
            "share_any_thread": c["seconds_any_thread"] / profiled["seconds"],
            "training_thread_off_cpu_seconds": profiled["seconds"] - profiled["thread_cpu_seconds"],
            "events": c["events"]})
    memory = []
    for rank in ranks:
        base = rank["memory"]["rss_before_build"]
        warmup = rank["updates"][0]
        # before the first optimizer step: weights, gradients, master copies; after it: AdamW's moments too
        held = {k: warmup["held_pre_step"][k] for k in KINDS}
        held["optimizer_state"] = warmup["held_after"]["optimizer_state"]
        peaks = [rank["memory"]["peak_build"]] + [u["peak"] for u in rank["updates"] if u["kind"] != "profile"]
        memory.append({
            "rss_before_build": base,
            "model_built": rank["memory"]["rss_model"] - base,
            "after_engine_built": rank["memory"]["rss_engine"] - base,
            "peak_build": rank["memory"]["peak_build"] - base,
            "peak_run": max(peaks) - base,
            "peak_update": max(u["peak"] for u in rank["updates"] if u["kind"] == "timed") - base,
            "after_update": [u for u in rank["updates"] if u["kind"] == "timed"][-1]["rss_after"] - base,
            "held": held,
            "other_by_owner": warmup["held_pre_step"]["other_by_owner"],
            "bytes_per_parameter": {k: v / params for k, v in held.items()},
            "state_bytes_per_parameter": sum(held[k] for k in KINDS[:4]) / params,
        })
    out["memory"] = memory
    return out


def print_report(summary: dict) -> None:
    runs = summary["runs"]
    print(f"\nmachine: {summary['machine']}; torch {summary['torch']}, deepspeed {summary['deepspeed']}")
    print(f"shape {summary['shape']} ({summary['parameters'] / 1e6:.1f}M parameters); batch: {summary['batch']}")
    print(f"\n{'run':9s} {'date':10s} {'ranks':>5s} {'thr':>3s} {'others':>6s} {'update s':>8s} {'runs':18s} "
          f"{'training / reduce s, per rank':30s} {'off-CPU s, per rank'}")
    for name, r in runs.items():
        split = "; ".join(f"{t['training']:.1f} / {t['reduce']:.1f}" for t in r["rank_times"])
        print(f"{name:9s} {r['date']:10s} {r['world']:5d} {r['threads_per_rank']:3d} {r['other_cores_busy']:6.2f} "
              f"{r['update_seconds']:8.2f} {', '.join(f'{x:.1f}' for x in r['update_seconds_runs']):18s} "
              f"{split:30s} {'; '.join(f'{x:.1f}' for x in r['off_cpu_seconds'])}")
    if "torch-1" in runs and "fsdp2-2" in runs:
        print(f"speed-up of 2 FSDP2 ranks over one torch process: "
              f"{runs['torch-1']['update_seconds'] / runs['fsdp2-2']['update_seconds']:.2f}x")
    print("\nprofiled update: seconds with a collective in flight (any thread), on the training thread, and the "
          "training thread's time off the CPU")
    print(f"{'run':9s} {'rank':>4s} {'update s':>8s} {'in flight':>16s} {'training thread':>16s} {'off-CPU':>8s}")
    for name, r in runs.items():
        for i, c in enumerate(r["collectives"]):
            print(f"{name:9s} {i:4d} {c['update_seconds']:8.2f} {c['seconds_any_thread']:7.2f} "
                  f"({c['share_any_thread']:5.1%}) {c['seconds_main_thread']:7.2f} ({c['share_main_thread']:5.1%}) "
                  f"{c['training_thread_off_cpu_seconds']:8.2f}")
    print("\ncollective events of the profiled update (rank 0; count, summed seconds; nested events overlap):")
    for name, r in runs.items():
        if r["collectives"]:
            events = r["collectives"][0]["events"]
            print(f"  {name}: " + "; ".join(f"{k} x{v['count']} {v['seconds']:.2f} s" for k, v in events.items()))
    print("\nRSS added since before the model was built (GiB): peak over the run (build, warm-up and timed "
          "updates), peak within a timed update, after the last timed update. Tensors held in bytes per "
          "parameter (weights, gradients, AdamW moments, float32 master copies: the state), and DeepSpeed's "
          "gradient buckets and everything else (MiB allocated)")
    print(f"{'run':9s} {'rank':>4s} {'peak run':>8s} {'peak upd':>8s} {'after':>6s} | {'params':>6s} {'grads':>6s} "
          f"{'adam':>6s} {'master':>6s} {'state':>6s} | {'buckets':>8s} {'other':>7s}")
    for name, r in runs.items():
        for i, m in enumerate(r["memory"]):
            b, held = m["bytes_per_parameter"], m["held"]
            print(f"{name:9s} {i:4d} {m['peak_run'] / GiB:8.2f} {m['peak_update'] / GiB:8.2f} "
                  f"{m['after_update'] / GiB:6.2f} | {b['parameters']:6.2f} {b['gradients']:6.2f} "
                  f"{b['optimizer_state']:6.2f} {b['master_weights']:6.2f} {m['state_bytes_per_parameter']:6.2f} | "
                  f"{held['gradient_buckets'] / 2**20:8.0f} {held['other'] / 2**20:7.0f}")


def others_busy(window: float = 10.0) -> float:
    """Cores the machine kept busy over `window` seconds while this benchmark ran nothing."""
    before = busy_seconds()
    time.sleep(window)
    return (busy_seconds() - before) / window


def per_parameter(runs: dict) -> dict:
    """Each engine's state bytes per parameter per rank as replicated + sharded / W, solved from its runs at
    1 and 2 ranks kind by kind (b(W) = r + s / W), with DeepSpeed's gradient buckets as a constant."""
    fits = {}
    for engine, (one, two) in FITS.items():
        if one not in runs or two not in runs:
            continue
        b1 = runs[one]["memory"][0]["bytes_per_parameter"]
        ranks = runs[two]["memory"]
        b2 = {k: statistics.mean(m["bytes_per_parameter"][k] for m in ranks) for k in KINDS[:4]}
        kinds = {k: {"replicated": 2 * b2[k] - b1[k], "sharded": 2 * (b1[k] - b2[k])} for k in KINDS[:4]}
        fits[engine] = {
            "by_kind": kinds,
            "replicated": sum(v["replicated"] for v in kinds.values()),
            "sharded": sum(v["sharded"] for v in kinds.values()),
            "buckets_bytes": max(m["held"]["gradient_buckets"] for m in ranks),
            "from": [one, two],
        }
    return fits


def sizing(fits: dict) -> dict:
    """GiB per rank for weights, gradients and AdamW state of MODELS on GPUS ranks, from the fits."""
    table = {}
    for model, params in MODELS.items():
        for engine, fit in fits.items():
            table[f"{model} {engine}"] = {
                str(w): (params * (fit["replicated"] + fit["sharded"] / w) + fit["buckets_bytes"]) / GiB for w in GPUS}
    return table


def print_sizing(summary: dict) -> None:
    fits = summary.get("per_parameter", {})
    if not fits:
        return
    print("\nstate bytes per parameter per rank = replicated + sharded / W (float32 weights, gradients, AdamW "
          "moments, master copies), solved from the runs at 1 and 2 ranks; DeepSpeed's gradient buckets extra:")
    for engine, fit in fits.items():
        kinds = ", ".join(f"{k} {v['replicated']:.2f} + {v['sharded']:.2f}/W" for k, v in fit["by_kind"].items())
        print(f"  {engine:7s} {fit['replicated']:5.2f} + {fit['sharded']:5.2f} / W   ({kinds}); buckets "
              f"{fit['buckets_bytes'] / GiB:.2f} GiB")
    print("\nextrapolated GiB per rank (weights + gradients + AdamW state + buckets; activations extra):")
    print(f"  {'model, engine':26s} " + " ".join(f"{w:>7d}" for w in GPUS))
    for row, cells in summary["sizing"].items():
        print(f"  {row:26s} " + " ".join(f"{cells[str(w)]:7.1f}" for w in GPUS))


def wait_for_quiet(limit: float, longest: float) -> float:
    """Wait (at most `longest` seconds) until other processes keep fewer than `limit` cores busy; that figure."""
    deadline = time.monotonic() + longest
    busy = others_busy()
    while busy >= limit and time.monotonic() < deadline:
        print(f"other processes keep {busy:.2f} cores busy (load average {os.getloadavg()[0]:.1f}): waiting",
              flush=True)
        time.sleep(20)
        busy = others_busy()
    return busy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="speed,memory", help="speed, memory or both")
    parser.add_argument("--runs", default="", help=f"only these runs (comma-separated of {', '.join(RUNS)})")
    parser.add_argument("--shape", default="smollm2-135m", help="a shapes.SHAPES name")
    parser.add_argument("--repeats", type=int, default=3, help="timed updates per engine, after one warm-up")
    parser.add_argument("--wait-busy", type=float, default=0.3,
                        help="before each engine's run, wait (up to --wait-max s) until other processes keep fewer "
                             "than this many cores busy (measured over 10 s); 0: do not wait")
    parser.add_argument("--wait-max", type=float, default=600)
    parser.add_argument("--timeout", type=float, default=1200, help="seconds one engine's run may take")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "bench_ranks.json")
    parser.add_argument("--report", action="store_true", help="recompute and print the figures in --out; run nothing")
    parser.add_argument("--rank-child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--dir", default="", help=argparse.SUPPRESS)
    parser.add_argument("--deepspeed-config", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_child:
        rank_child(args)
        return
    import torch

    if args.report:
        summary = json.loads(args.out.read_text())
        for name, run in summary["raw"].items():
            summary["runs"][name] = summarize(run)
        summary["runs"] = {n: summary["runs"][n] for n in RUNS if n in summary["runs"]}
        summary["per_parameter"] = per_parameter(summary["runs"])
        summary["sizing"] = sizing(summary["per_parameter"])
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
        print_report(summary)
        print_sizing(summary)
        return
    parts = set(args.parts.split(","))
    names = [name for name, (_, _, run_parts) in RUNS.items() if parts & set(run_parts)]
    if args.runs:
        names = [name for name in RUNS if name in args.runs.split(",")]
    print(f"machine: {machine()}; runs: {', '.join(names)}", flush=True)
    summary: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-ranks-") as tmp:
        for name in names:
            quiet = wait_for_quiet(args.wait_busy, args.wait_max) if args.wait_busy else None
            run = run_engine(name, args, Path(tmp))
            run["others_busy_before"] = quiet
            summary = record(args, name, run, torch.__version__)  # written after each engine: a stop loses no run
    print_report(summary)
    print_sizing(summary)
    print(f"\nJSON: {args.out}")


def record(args, name: str, run: dict, torch_version: str) -> dict:
    """Merge one engine's run into the JSON at --out (runs of other engines there, on the same shape, kept)."""
    from importlib.metadata import version

    first = run["ranks"][0]
    summary = {
        "machine": machine(), "torch": torch_version, "deepspeed": version("deepspeed"),
        "shape": args.shape, "parameters": first["parameters"],
        "batch": f"{first['sequences']} sequences (4 prompts of 512 tokens x 4 rollouts of 64-192 generated "
                 f"tokens), {first['tokens']} tokens unpacked, {first['loss_tokens']} generated; packing on, "
                 f"micro-batch 4, float32, AdamW",
        "runs": {}, "raw": {}, "commands": {},
    }
    if args.out.exists():
        earlier = json.loads(args.out.read_text())
        if earlier.get("shape") == args.shape:
            for key in ("runs", "raw", "commands"):
                summary[key].update(earlier.get(key, {}))
    summary["runs"][name] = summarize(run)
    summary["raw"][name] = run
    summary["commands"][name] = " ".join([".venv/bin/python", "bench/bench_ranks.py", *sys.argv[1:]])
    summary["runs"] = {n: summary["runs"][n] for n in RUNS if n in summary["runs"]}
    summary["per_parameter"] = per_parameter(summary["runs"])
    summary["sizing"] = sizing(summary["per_parameter"])
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    return summary


if __name__ == "__main__":
    main()

"""How `coevolve learner` starts its ranks, reads a failure out of torchrun's summary, and splits a batch."""
import pytest

from coevolve.services.learner.config import RanksConfig, rollout_backend
from coevolve.services.learner.ranks.launch import root_cause, torchrun_command
from coevolve.services.learner.ranks.group import Ranks
from coevolve.services.learner.ranks.split import assign
from coevolve.services.runtime.config import ConfigError

SUMMARY = """[rank0]: Traceback ...
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
coevolve FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-04_17:58:01
  host      : worker-3
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4242)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4242
============================================================
"""


def test_one_node_meets_at_a_loopback_store_and_several_meet_at_node_zero_with_static_ranks():
    one = torchrun_command(RanksConfig(world_size=2), ["learner", "--resume"], "/venv/bin/coevolve", 29411)
    assert {"--rdzv-endpoint=127.0.0.1:29411", "--rdzv-conf=is_host=false", "--local-addr=127.0.0.1",
            "--nproc-per-node=2", "--nnodes=1"} <= set(one) and "--standalone" not in one
    assert one[-4:] == ["--no-python", "/venv/bin/coevolve", "learner", "--resume"]
    many = torchrun_command(RanksConfig(world_size=16, nnodes=2, node_rank=1, rdzv_endpoint="learner-0.ranks:29400",
                                        max_restarts=3), ["learner"], "coevolve")
    assert not any(arg.startswith(("--rdzv", "--local-addr")) for arg in many)
    assert {"--nproc-per-node=8", "--nnodes=2", "--node-rank=1", "--master-addr=learner-0.ranks",
            "--master-port=29400", "--max-restarts=3"} <= set(many)


def test_the_failed_rank_and_its_exit_are_read_from_the_root_cause():
    assert root_cause(SUMMARY) == (1, -9)
    assert root_cause("Failures:\n  rank : 0\n  exitcode : 1\n") is None  # not the root cause section
    assert root_cause("no summary at all") is None


def test_micro_batches_go_longest_first_to_the_least_loaded_rank():
    parts = [[0, 1], [2], [3, 4, 5], [6]]
    tokens = [10, 10, 50, 5, 5, 5, 30]  # per sequence: parts weigh 20, 50, 15, 30
    assert assign(parts, tokens, 2) == [[1, 2], [0, 3]]  # 50 -> 0, 30 -> 1, 20 -> 1, 15 -> 0 (a tie: lowest rank)
    assert assign(parts, tokens, 1) == [[0, 1, 2, 3]]
    spread = assign(parts, tokens, 3)
    assert sorted(i for rank in spread for i in rank) == [0, 1, 2, 3] and all(spread)
    assert assign(parts[:1], tokens, 2) == [[0], []]  # a rank may get none: it runs weightless rounds


def test_a_launcher_world_size_must_match_the_setting_and_vllm_moves_out_of_process_with_ranks():
    Ranks(rank=0, world_size=2).check(2)
    Ranks(rank=0, world_size=2).check(1)  # launched by hand (deepspeed or torchrun) without the setting
    with pytest.raises(ConfigError, match="started 4 ranks but learner.world_size is 2"):
        Ranks(rank=0, world_size=4).check(2)
    assert rollout_backend("vllm", 2) == "vllm-server" and rollout_backend("vllm", 1) == "vllm"
    assert rollout_backend("transformers", 2) == "transformers"

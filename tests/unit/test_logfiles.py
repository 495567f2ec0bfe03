"""Logs do not grow without bound across runs: a start rotates an appended log past its limit, and a folder
of per-start server logs keeps its newest."""
import os

from coevolve.services.runtime.logfiles import prune, rotate, rotate_open


def test_a_log_over_its_limit_is_rotated_at_start_and_the_oldest_dropped(tmp_path):
    log = tmp_path / "learner.log"
    assert not rotate(log, max_bytes=10)  # nothing there yet
    log.write_text("small")
    assert not rotate(log, max_bytes=10) and log.read_text() == "small"
    for n in range(3):
        log.write_text(f"run {n} " * 5)
        assert rotate(log, max_bytes=10, keep=2)
    assert not log.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["learner.log.1", "learner.log.2"]
    assert (tmp_path / "learner.log.1").read_text().startswith("run 2")
    assert (tmp_path / "learner.log.2").read_text().startswith("run 1")  # run 0's was dropped


def test_a_folder_of_per_start_logs_keeps_its_newest(tmp_path):
    for n in range(5):
        path = tmp_path / f"vllm-server-{4000 + n}.log"
        path.write_text("x")
        os.utime(path, (1_000 + n, 1_000 + n))
    (tmp_path / "other.txt").write_text("kept")
    removed = prune(tmp_path, "vllm-server-*.log", keep=2)
    assert sorted(p.name for p in removed) == [f"vllm-server-{4000 + n}.log" for n in range(3)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.txt", "vllm-server-4003.log", "vllm-server-4004.log"]


def test_a_log_still_written_is_copied_aside_and_truncated_and_its_writer_goes_on_at_the_start(tmp_path):
    """A service runs for days with its log open: the run rotates it in place as it tends the service."""
    log = tmp_path / "explorer.log"
    writer = open(log, "ab", buffering=0)  # as Child.start opens it for the process
    try:
        writer.write(b"old line\n" * 4)
        assert not rotate_open(log, max_bytes=100) and log.stat().st_size == 36
        writer.write(b"old line\n" * 20)
        assert rotate_open(log, max_bytes=100, keep=2)
        assert (tmp_path / "explorer.log.1").read_bytes() == b"old line\n" * 24 and log.stat().st_size == 0
        writer.write(b"new line\n")
        assert log.read_bytes() == b"new line\n"  # appended at the start, no hole of zeros before it
        writer.write(b"x" * 200)
        assert rotate_open(log, max_bytes=100, keep=2)
        assert (tmp_path / "explorer.log.2").read_bytes() == b"old line\n" * 24
    finally:
        writer.close()

"""`coevolve check` end to end: broker, simulated learner, live signals equal to replay, archive, report."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from coevolve.services.clickhouse.client import chdb_url, connect

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_coevolve_check_raises_the_replayed_signals_live_and_archives_them(tmp_path, monkeypatch):
    monkeypatch.delenv("KAFKA_BOOTSTRAP", raising=False)
    exe = str(Path(sys.executable).with_name("coevolve"))
    done = subprocess.run([exe, "check", "--workdir", str(tmp_path), "--steps", "4"], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    counts = {t: int(n) for t, n in re.findall(r"^(coevolve\.\w+)\s+(\d+) events$", out, re.M)}
    assert counts["coevolve.trajectories"] == 4 * 16 * 8 and counts["coevolve.steps"] == 4
    live, replayed = map(int, re.search(r"signals: live (\d+), replay (\d+): equal", out).groups())
    assert live == replayed == counts["coevolve.signals"] > 0

    report = tmp_path / "report"
    assert (report / "index.html").exists()
    assert len(list(report.glob("*.png"))) >= 5
    client = connect(chdb_url(tmp_path), create=False)
    try:
        archived = client.query("SELECT count() FROM coevolve.signals FINAL").result_rows[0][0]
        trajectories = client.query("SELECT count() FROM coevolve.trajectories FINAL").result_rows[0][0]
    finally:
        client.close()
    assert archived == live and trajectories == counts["coevolve.trajectories"]

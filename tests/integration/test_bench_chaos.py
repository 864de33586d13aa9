"""`flatpack bench chaos` end to end, small: worker processes really killed and stalled under load, busy
masters killed, all instances reaped; nothing lost, nothing wrong, nothing left behind. And the fault
injector on its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.harness.local_deployment import InstanceView
from bench.reliability.faults import FaultInjector

pytest.importorskip("zoo.builder")
pytest.importorskip("torch")


def test_bench_chaos_loses_nothing(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "serving.cli", "bench", "chaos", "--json", "-c", "2", "-n", "20",
         "--fault-free-requests", "8", "--disruption-requests", "6", "--think-ms", "40", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "FLATPACK_CACHE_DIR": str(tmp_path / "cache")})
    assert res.returncode in (0, 1), res.stderr
    doc = json.loads(res.stdout)
    assert {"sent", "answered", "correct", "clear_errors", "lost", "p99_ms", "p99_ms_fault_free", "faults"} <= set(doc)
    assert doc["sent"] == 2 * (20 + 6)
    assert doc["lost"] == 0 and doc["wrong"] == 0
    assert doc["answered"] + doc["clear_errors"] == doc["sent"]
    assert doc["correct"] >= 0.95 * doc["sent"]
    kills = doc["faults"]["worker_kills"]
    assert kills["kills"] >= 3 and 0.05 <= kills["kill_fraction"] <= 0.2
    assert doc["faults"]["disruptions"]["reap_all"]["instances_stopped"] >= 1
    mem = doc["faults"]["disruptions"]["memory"]
    if isinstance(mem, dict):  # a worker was caught busy and pushed over its limit: its request ends clearly
        assert mem["limit_mb"] < mem["rss_mb"]
        assert any("OutOfMemory" in e for e in doc["phases"]["disruptions"]["errors"]), doc["phases"]["disruptions"]
    # masters killed mid-request are sent again and leave nothing behind: no tensor after any phase
    assert doc["faults"]["disruptions"]["master_kills"]["killed"] >= 1
    assert {k: v["tensors_left"] for k, v in doc["phases"].items()} == {"fault_free": 0, "faults": 0, "disruptions": 0}
    assert doc["targets"]["no_tensors_left"]
    assert doc["leftovers_after_teardown"] == {"instance_processes": 0, "shm_files": 0}
    assert (tmp_path / "chaos-own.json").exists()


def test_injector_kills_busy_workers_at_its_rate() -> None:
    """Fake instances backed by real sleeping processes: 10 % of the invocations it sees end in a SIGKILL,
    only busy workers are hit, the master never."""
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(3)]
    try:
        calls = {"n": 0}

        def source() -> list[InstanceView]:
            calls["n"] += 1
            n = 10 * calls["n"]  # ten new invocations per poll on each instance
            return [InstanceView("w", 1, procs[0].pid, True, n), InstanceView("w", 2, procs[1].pid, False, n),
                    InstanceView("master", 3, procs[2].pid, True, n)]

        inj = FaultInjector(source, ["w"], kill_rate=0.1, poll_s=0.001).start()
        t_end = time.monotonic() + 10
        while procs[0].poll() is None and time.monotonic() < t_end:
            time.sleep(0.01)
        counts = inj.stop()
        assert procs[0].wait(5) == -signal.SIGKILL
        assert procs[1].poll() is None and procs[2].poll() is None  # idle worker and master untouched
        assert counts.kills == 1 and counts.worker_invocations >= 10
    finally:
        for p in procs:
            p.kill()
            p.wait()

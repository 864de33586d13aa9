"""A foreground command (a watch, a deployment served in the foreground) stops on SIGINT and SIGTERM, also
where it was started with SIGINT ignored (a script's ``cmd &``, ``nohup``): its clean-up runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from serving.platform.runtimes import project_pythonpath

# waits as `flatpack deploy` does in the foreground, and says so once it has been stopped
_WAIT = """
import sys, time
from serving.cli.stop_signals import stop_on_signals
restore = stop_on_signals()
try:
    print("waiting", flush=True)  # inside the try: the signal may come before print returns
    while True:
        time.sleep(0.05)
except KeyboardInterrupt as e:
    print("stopped by", e, flush=True)
finally:
    restore()
"""


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_foreground_wait_started_with_sigint_ignored_stops_on_the_signal_and_cleans_up(sig: signal.Signals) -> None:
    env = {**os.environ, "PYTHONPATH": project_pythonpath()}
    proc = subprocess.Popen([sys.executable, "-c", _WAIT], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, preexec_fn=_ignore_sigint)  # noqa: PLW1509 - only a signal disposition
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "waiting"
        ignored = int(next(ln for ln in open(f"/proc/{proc.pid}/status") if ln.startswith("SigIgn:")).split()[1], 16)
        assert not ignored & (1 << (signal.SIGINT - 1))  # the helper took SIGINT back
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert f"stopped by {sig.name}" in out and proc.returncode == 0, (out, proc.returncode)


def test_off_the_main_thread_it_changes_nothing() -> None:
    import threading

    from serving.cli.stop_signals import stop_on_signals

    before = signal.getsignal(signal.SIGTERM)
    done: list[object] = []
    t = threading.Thread(target=lambda: done.append(stop_on_signals()()))
    t.start()
    t.join(30)
    assert done and signal.getsignal(signal.SIGTERM) is before

"""The Serverless Framework v3 and serverless-offline for the tests of the AWS Lambda target: the CLI
(installed into ``build/tools`` with npm when missing, from the lockfile in ``tests/integration/node``;
tests skip where Node is absent) and a context manager running a rendered service under serverless-offline."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT, TEST_ROOT, free_port

__all__ = ["SLS_ENV", "TOOLS", "serverless_cli", "serverless_offline"]

TOOLS = PROJECT_ROOT / "build" / "tools"
SLS = TOOLS / "node_modules" / ".bin" / "serverless"
# serverless@3 and serverless-offline@13 with every dependency pinned: an unpinned install resolves the newest
# versions the registry lists, and once resolved one its mirror did not hold (npm ETARGET) in a fresh clone
NODE_LOCK = Path(__file__).parent / "node"
# HOME: the framework caches compiled schemas in ~/.serverless and npm its downloads in ~/.npm; the run's own
# home keeps them off the user's
SLS_ENV = {"HOME": str(TEST_ROOT / "home"), "SLS_TELEMETRY_DISABLED": "1", "SLS_NOTIFICATIONS_MODE": "off",
           "SLS_DEPRECATION_DISABLE": "*", "SLS_TRACKING_DISABLED": "1", "AWS_ACCESS_KEY_ID": "test",
           "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}


def serverless_cli() -> Path:
    """The Serverless Framework v3 CLI (with serverless-offline beside it), installed with npm if missing;
    skips where Node is absent."""
    if shutil.which("node") is None:
        pytest.skip("Node.js is not installed: the Serverless Framework checks need node and npm")
    if SLS.exists():
        return SLS
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: cannot install the Serverless Framework into build/tools")
    TOOLS.mkdir(parents=True, exist_ok=True)
    # pytest-xdist workers that all find it missing install it one at a time: two npm installs into one
    # prefix at once fail (ENOTEMPTY), as a fresh clone's CI run once did
    with open(TOOLS / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not SLS.exists():
            for name in ("package.json", "package-lock.json"):
                shutil.copyfile(NODE_LOCK / name, TOOLS / name)
            res = subprocess.run([npm, "ci", "--prefix", str(TOOLS), "--no-audit", "--no-fund"], capture_output=True,
                                 text=True, timeout=600, check=False, env={**os.environ, **SLS_ENV})
            assert res.returncode == 0, f"npm ci failed:\n{res.stderr[-3000:]}"
    return SLS


@contextmanager
def serverless_offline(sls: Path, render: Callable[[str], Path], log_path: Path, warm: Sequence[str], *,
                       http: bool = True) -> Iterator[str]:
    """serverless-offline serving the service ``render(lambda_url)`` writes (it must point the master's invoker
    at ``lambda_url``): HTTP on one loopback port (yielded), Lambda on another; ``warm`` are cold-started.
    ``http`` False: a service with no HTTP events, ready once its Lambda port accepts connections."""
    http_port, lambda_port, ws_port, alb_port = (free_port() for _ in range(4))
    lambda_url = f"http://127.0.0.1:{lambda_port}"
    out = render(lambda_url)
    # python handlers run with `python3` from PATH: this interpreter's (VIRTUAL_ENV's bin goes first)
    env = {**os.environ, **SLS_ENV, "VIRTUAL_ENV": sys.prefix,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([str(sls), "offline", "--region", "us-east-1", "--host", "127.0.0.1",
                             "--httpPort", str(http_port), "--lambdaPort", str(lambda_port),
                             "--websocketPort", str(ws_port), "--albPort", str(alb_port)],
                            cwd=out, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{http_port}"
    try:
        end = time.monotonic() + 90
        while True:
            if _ready(url if http else None, lambda_port):
                break
            if proc.poll() is not None or time.monotonic() > end:
                log.flush()
                pytest.fail(f"serverless offline did not start:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        _warm_up(lambda_url, list(warm))
        yield url
    finally:
        # the process group we started: serverless and the python handler processes it spawned
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
        log.close()


def _ready(http_url: str | None, lambda_port: int) -> bool:
    """Whether the endpoint answers its health check (``http_url``), or else the Lambda port connections."""
    try:
        if http_url is None:
            socket.create_connection(("127.0.0.1", lambda_port), timeout=2).close()
            return True
        with urllib.request.urlopen(f"{http_url}/v2/health/live", timeout=5) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _warm_up(lambda_url: str, names: list[str]) -> None:
    """Cold-start every function first (Gillis's warm-up): serverless-offline's Python context gives an
    invocation 6 s, less than three concurrent cold starts of numpy + onnxruntime may take on two cores.
    An empty event is answered with a structured BadRequest once the instance has loaded its parts."""
    from concurrent.futures import ThreadPoolExecutor

    if not names:  # the caller times the cold starts itself
        return
    import boto3
    import botocore.config

    client = boto3.client("lambda", endpoint_url=lambda_url, region_name="us-east-1", aws_access_key_id="test",
                          aws_secret_access_key="test",
                          config=botocore.config.Config(read_timeout=120, retries={"total_max_attempts": 1}))

    def ping(name: str) -> dict:
        return json.loads(client.invoke(FunctionName=name, Payload=b"{}")["Payload"].read())

    with ThreadPoolExecutor(len(names)) as pool:
        replies = list(pool.map(ping, names))
    assert all(r.get("error", {}).get("type") == "BadRequest" for r in replies), replies

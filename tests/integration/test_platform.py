"""The local platform, for real: instance processes, HTTP (Lambda and OpenFaaS shapes), boto3 against it,
cold starts, idle reaping, concurrency limits, memory limits, timeouts, crashes, the billing meter."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from functions.codec import decode, encode
from functions.errors import (
    FunctionNotFound,
    InstanceCrashed,
    InvokeTimeout,
    OutOfMemory,
    PayloadTooLarge,
    Throttled,
    error_from_json,
)
from functions.event import Event, Reply, TensorEntry, now_ms
from functions.invoker.local import TOKEN_HEADER, LocalInvoker
from functions.invoker.openfaas import OpenFaaSInvoker

pytest.importorskip("fastapi", reason="the platform tests need flatpack[server]")

from serving.platform import FunctionSpec, LocalPlatform, PlatformConfig  # noqa: E402
from serving.platform.deploy import Deployment, deploy_bundle  # noqa: E402
from tests.conftest import wait_busy  # noqa: E402


@pytest.fixture
def deploy(platform: LocalPlatform) -> Iterator:
    made: list[Deployment] = []

    def _deploy(bundle: Path, **kw: object) -> Deployment:
        kw.setdefault("transport", "inline")
        d = deploy_bundle(platform.client, bundle, shm_dir=platform.config.shm_dir, **kw)
        made.append(d)
        return d

    yield _deploy
    for d in made:
        d.remove()


def part_event(d: Deployment, x: dict[str, np.ndarray], *, deadline_s: float = 30.0) -> Event:
    return Event("part", f"r{time.monotonic_ns()}", d.id, now_ms() + int(1000 * deadline_s),
                 tuple(TensorEntry(k, data=encode(v)) for k, v in x.items()), stage=0, part=0)


def outputs(body: bytes) -> dict[str, np.ndarray]:
    r = Reply.decode(body)
    if r.error:
        raise error_from_json(r.error)
    return {e.name: decode(e.data) for e in r.outputs}  # type: ignore[arg-type]


def usage(platform: LocalPlatform, name: str) -> dict:
    return platform.client.meter()["functions"].get(name, {})


X = {"x": np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)}
Y = np.array([[0.0, 2.0, 0.0, 4.0]], np.float32)


def test_lambda_shape_cold_then_warm(platform: LocalPlatform, bundles, deploy) -> None:
    d = deploy(bundles.tiny)
    worker = d.names["worker-1"]
    inv = LocalInvoker(platform.url)
    for _ in range(3):
        np.testing.assert_array_equal(outputs(inv.invoke(worker, part_event(d, X).encode(), timeout_s=30))["y"], Y)
    u = usage(platform, worker)
    assert u["invocations"] == 3 and u["cold_starts"] == 1 and u["errors"] == 0
    (inst,) = platform.client.function(worker)["instances"]
    assert inst["invocations"] == 3 and not inst["busy"]


def test_boto3_lambda_client_against_the_platform(platform: LocalPlatform, bundles, deploy, aws_env) -> None:
    pytest.importorskip("boto3")
    from functions.invoker.aws_lambda import LambdaInvoker

    d = deploy(bundles.tiny)
    inv = LambdaInvoker(endpoint_url=platform.url, headers={TOKEN_HEADER: platform.token})
    body = inv.invoke(d.names["worker-1"], part_event(d, X).encode(inv.wire), timeout_s=30)
    assert body.startswith(b"{")  # JSON both ways, as a real Lambda handler would take and give
    np.testing.assert_array_equal(outputs(body)["y"], Y)
    with pytest.raises(FunctionNotFound, match="no-such-function"):
        inv.invoke("no-such-function", b"{}", timeout_s=5)

    import boto3
    from botocore.exceptions import ClientError

    from serving.platform.client import authorize_boto3

    raw = authorize_boto3(boto3.client("lambda", endpoint_url=platform.url, region_name="us-east-1"), platform.token)
    with pytest.raises(ClientError) as info:
        raw.invoke(FunctionName="no-such-function", Payload=b"{}")
    assert info.value.response["Error"]["Code"] == "ResourceNotFoundException"
    resp = raw.invoke(FunctionName=d.names["worker-1"], Payload=part_event(d, X).encode("json"))
    assert resp["StatusCode"] == 200 and "FunctionError" not in resp


def test_openfaas_shape(platform: LocalPlatform, bundles, deploy) -> None:
    d = deploy(bundles.tiny)
    inv = OpenFaaSInvoker(platform.url, headers={TOKEN_HEADER: platform.token})
    body = inv.invoke(d.names["worker-1"], part_event(d, X).encode(), timeout_s=30)
    np.testing.assert_array_equal(outputs(body)["y"], Y)
    # the part fails on a wrong input: a structured error in the body, HTTP 500
    body = inv.invoke(d.names["worker-1"], part_event(d, {"wrong": X["x"]}).encode(), timeout_s=30)
    assert Reply.decode(body).error["type"] == "PartError"  # type: ignore[index]
    req = urllib.request.Request(f"{platform.url}/function/{d.names['worker-1']}",  # noqa: S310 - loopback
                                 data=part_event(d, {"wrong": X["x"]}).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {platform.token}"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=30)  # noqa: S310 - loopback
    assert info.value.code == 500


def test_billing_meter_and_prometheus(platform: LocalPlatform, bundles, deploy) -> None:
    d = deploy(bundles.tiny, memory_mb={"worker-1": 1024})
    worker = d.names["worker-1"]
    inv = LocalInvoker(platform.url)
    for _ in range(4):
        inv.invoke(worker, part_event(d, X).encode(), timeout_s=30)
    u = usage(platform, worker)
    assert u["invocations"] == 4 and u["memory_mb"] == 1024
    # Lambda's rule: each duration rounded up to the 1 ms granularity, times memory in GB
    assert 4 <= u["billed_ms"] and u["duration_ms"] <= u["billed_ms"] <= u["duration_ms"] + 4
    assert u["billed_gb_s"] == pytest.approx(1024 / 1024 * u["billed_ms"] / 1000)
    assert u["cost_usd"] == pytest.approx(u["billed_gb_s"] * 0.0000166667 + 4 * 0.2e-6)
    text = platform.client.metrics_text()
    assert re.search(rf'flatpack_invocations_total{{function="{worker}"}} 4\.0', text)
    assert f'flatpack_billed_gb_seconds_total{{function="{worker}"}}' in text
    assert f'flatpack_cold_starts_total{{function="{worker}"}} 1.0' in text


def test_cpu_share_follows_memory(platform: LocalPlatform, bundles, deploy) -> None:
    d = deploy(bundles.tiny, memory_mb={"master": 3538, "worker-1": 1000})
    fns = {f["name"]: f for f in platform.client.functions()}
    assert fns[d.names["master"]]["intra_op_threads"] == min(os.cpu_count() or 1, 2)  # 2 vCPUs at 3538 MB
    assert fns[d.names["worker-1"]]["intra_op_threads"] == 1


def test_out_of_memory_is_killed_and_reported(platform: LocalPlatform, bundles, deploy) -> None:
    d = deploy(bundles.hog(64 * 2**20, worker_memory_mb=192))  # a 256 MB tensor in a 192 MB function
    worker = d.names["worker-1"]
    with pytest.raises(OutOfMemory, match="192 MB") as info:
        LocalInvoker(platform.url).invoke(worker, part_event(d, {"x": np.ones(1, np.float32)}).encode(), timeout_s=60)
    assert "more memory" in str(info.value)
    assert usage(platform, worker)["errors_by_type"] == {"OutOfMemory": 1}
    assert platform.client.function(worker)["instances"] == []
    # the same through the Lambda shape, as boto3 would see it
    req = urllib.request.Request(f"{platform.url}/2015-03-31/functions/{worker}/invocations",  # noqa: S310
                                 data=part_event(d, {"x": np.ones(1, np.float32)}).encode(), method="POST",
                                 headers={TOKEN_HEADER: platform.token})
    with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - loopback
        assert resp.status == 200 and resp.headers["X-Amz-Function-Error"] == "Unhandled"
        assert json.loads(resp.read())["errorType"] == "Runtime.OutOfMemory"


def test_crash_and_timeout_are_reported(platform: LocalPlatform, bundles, deploy) -> None:
    d = deploy(bundles.slow)
    worker = d.names["worker-1"]
    inv = LocalInvoker(platform.url)
    x = {"x": np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)}
    errors: list[BaseException] = []
    t = threading.Thread(target=lambda: errors.append(_catch(lambda: inv.invoke(
        worker, part_event(d, x).encode(), timeout_s=60))))
    t.start()
    os.kill(wait_busy(platform, worker), signal.SIGKILL)
    t.join(60)
    assert isinstance(errors[0], InstanceCrashed) and "SIGKILL" in str(errors[0]) and errors[0].retryable

    d2 = deploy(bundles.slower, timeout_s=0.05)
    t0 = time.monotonic()
    with pytest.raises(InvokeTimeout, match="timed out"):
        inv.invoke(d2.names["worker-1"], part_event(d2, x).encode(), timeout_s=60)
    assert time.monotonic() - t0 < 30


def _catch(fn) -> BaseException | None:
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - handed to the test thread
        return e
    return None


def test_concurrency_limit_queues_requests(platform: LocalPlatform, bundles, deploy) -> None:
    from concurrent.futures import ThreadPoolExecutor

    d = deploy(bundles.tiny, concurrency=2)
    worker = d.names["worker-1"]
    inv = LocalInvoker(platform.url)
    with ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(lambda _: outputs(inv.invoke(worker, part_event(d, X).encode(), timeout_s=30)),
                             range(12)))
    assert all(np.array_equal(o["y"], Y) for o in outs)
    u = usage(platform, worker)
    assert u["invocations"] == 12 and 1 <= u["cold_starts"] <= 2
    assert len(platform.client.function(worker)["instances"]) <= 2


def test_queue_timeout_throttles_without_cutting_the_running_request(platform: LocalPlatform, bundles,
                                                                     deploy) -> None:
    """queue_timeout_s=0: a request finding the one instance busy is throttled at once (Lambda's 429),
    while the running request keeps its whole timeout."""
    d = deploy(bundles.slower, concurrency=1, queue_timeout_s=0)
    worker = d.names["worker-1"]
    inv = LocalInvoker(platform.url)
    x = {"x": np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)}
    inv.invoke(worker, part_event(d, x).encode(), timeout_s=30)  # warm: the instance exists
    first = threading.Thread(target=lambda: inv.invoke(worker, part_event(d, x).encode(), timeout_s=30))
    first.start()
    t_end = time.monotonic() + 10
    while not platform.client.function(worker)["instances"][0]["busy"] and time.monotonic() < t_end:
        time.sleep(0.005)
    with pytest.raises(Throttled, match="concurrency limit"):  # waiting would have answered it
        inv.invoke(worker, part_event(d, x).encode(), timeout_s=30)
    first.join(30)
    assert not first.is_alive()
    u = usage(platform, worker)
    assert u["invocations"] == 3 and u["errors_by_type"].get("Throttled") == 1, u
    with pytest.raises(ValueError, match="queue_timeout_s"):
        FunctionSpec("neg-queue", memory_mb=256, queue_timeout_s=-1)


def test_idle_instances_are_reaped(bundles, shm_root: Path) -> None:
    with LocalPlatform(PlatformConfig(port=0, shm_dir=shm_root, idle_timeout_s=0.3, cpu_limit="off")) as p:
        d = deploy_bundle(p.client, bundles.tiny, transport="inline", shm_dir=shm_root)
        worker = d.names["worker-1"]
        inv = LocalInvoker(p.url)
        inv.invoke(worker, part_event(d, X).encode(), timeout_s=30)
        assert len(p.client.function(worker)["instances"]) == 1
        t_end = time.monotonic() + 10
        while p.client.function(worker)["instances"] and time.monotonic() < t_end:
            time.sleep(0.1)
        assert p.client.function(worker)["instances"] == []
        inv.invoke(worker, part_event(d, X).encode(), timeout_s=30)
        assert p.client.meter()["functions"][worker]["cold_starts"] == 2
        d.remove()


def test_payload_limit_and_unknown_function(platform: LocalPlatform, bundles, deploy) -> None:
    d = deploy(bundles.tiny)
    inv = LocalInvoker(platform.url)
    with pytest.raises(PayloadTooLarge):
        inv.invoke(d.names["worker-1"], b"x" * (7 * 2**20), timeout_s=30)
    with pytest.raises(FunctionNotFound):
        inv.invoke("nope", b"{}", timeout_s=5)


def test_registration_is_validated(platform: LocalPlatform) -> None:
    with pytest.raises(ValueError, match="HTTP 400"):
        platform.client.register(FunctionSpec("ok-name", memory_mb=64))  # under the profile's 128 MB
    with pytest.raises(ValueError, match="not valid"):
        FunctionSpec("bad/name", memory_mb=256)
    with pytest.raises(ValueError, match="HTTP 404"):
        platform.client.remove("never-registered")


def test_binds_loopback_by_default() -> None:
    assert PlatformConfig().host == "127.0.0.1"


def test_cli_start_status_stop(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "FLATPACK_STATE_DIR": str(tmp_path)}
    cli = [sys.executable, "-m", "serving.cli", "platform"]
    started = subprocess.run([*cli, "start", "--port", str(port)], env=env, capture_output=True, text=True,
                             timeout=60)
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == f"http://127.0.0.1:{port}"
    try:
        again = subprocess.run([*cli, "start", "--port", str(port)], env=env, capture_output=True, text=True,
                               timeout=60)
        assert again.returncode != 0 and "already running" in again.stderr
        status = subprocess.run([*cli, "status", "--json"], env=env, capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stderr
        doc = json.loads(status.stdout)
        assert doc["health"]["ok"] and doc["functions"] == [] and doc["meter"]["profile"] == "local"
    finally:
        stopped = subprocess.run([*cli, "stop"], env=env, capture_output=True, text=True, timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    gone = subprocess.run([*cli, "status"], env=env, capture_output=True, text=True, timeout=60)
    assert gone.returncode != 0 and "flatpack platform start" in gone.stderr


def test_cli_status_table(platform: LocalPlatform, bundles, deploy) -> None:
    from click.testing import CliRunner

    from serving.cli.platform import platform as platform_cmd

    d = deploy(bundles.tiny)
    LocalInvoker(platform.url).invoke(d.names["worker-1"], part_event(d, X).encode(), timeout_s=30)
    out = CliRunner().invoke(platform_cmd, ["status", "--url", platform.url])
    assert out.exit_code == 0, out.output
    assert "local platform at" in out.output and "GB-s billed" in out.output

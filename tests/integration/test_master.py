"""The master: fork-join over real function processes and every transport, retries, hedging, deadlines,
clean-up; plus the invocation policy on its own with fake invokers."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from functions.codec import encode
from functions.config import FunctionConfig
from functions.errors import (
    FunctionError,
    InstanceCrashed,
    InvokeTimeout,
    OutOfMemory,
    PartError,
    TransportError,
    error_from_json,
)
from functions.event import Event, Reply, TensorEntry, now_ms
from functions.invoker.base import Invoker
from functions.invoker.policy import CallKey, InvokePolicy, PolicyInvoker
from functions.plan import Plan
from functions.runtime import FunctionRuntime
from functions.transport.base import TensorKey
from functions.transport.shm import ShmTransport
from functions.worker import output_key

pytest.importorskip("fastapi", reason="the master tests run on the local platform (flatpack[server])")

from functions.compare import rel_err  # noqa: E402
from serving.platform import LocalPlatform  # noqa: E402
from serving.platform.deploy import Deployment, deploy_bundle  # noqa: E402
from serving.platform.master_client import MasterClient  # noqa: E402
from tests.conftest import wait_busy  # noqa: E402

BUNDLES = ["conv_channel", "conv_channel_master", "matmul_sum", "chain"]


def _inputs(bundle: Path, seed: int) -> dict[str, np.ndarray]:
    plan = Plan.load(bundle / "plan.json")
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in plan.model.inputs}


@pytest.fixture
def deploy(platform: LocalPlatform, request: pytest.FixtureRequest) -> Iterator:
    made: list[Deployment] = []

    def _deploy(bundle: Path, transport: str, **kw: object) -> Deployment:
        if transport == "redis":
            kw.setdefault("redis_url", request.getfixturevalue("redis_url"))
        if transport == "s3":
            kw["s3_endpoint_url"] = request.getfixturevalue("s3_endpoint")
        d = deploy_bundle(platform.client, bundle, transport=transport, shm_dir=platform.config.shm_dir, **kw)
        made.append(d)
        return d

    yield _deploy
    for d in made:
        d.remove()


def _check(d: Deployment, client: MasterClient, bundle: Path, reference, seed: int) -> None:
    x = _inputs(bundle, seed)
    got = client.infer(x)
    want = reference(bundle, x)
    for name, w in want.items():
        assert rel_err(got[name], w) <= 1e-5, (name, seed)


@pytest.mark.parametrize("transport", ["inline", "shm", "redis", "s3"])
def test_split_bundles_equal_the_unsplit_model(platform: LocalPlatform, bundles, reference, deploy,
                                               transport: str) -> None:
    for name in BUNDLES:
        bundle = getattr(bundles, name)
        d = deploy(bundle, transport)
        client = MasterClient(d, platform.url, timeout_s=60)
        for seed in range(1 if transport == "s3" else 2):  # moto's S3 is slow; one request shows it
            _check(d, client, bundle, reference, seed)
        client.close()
        assert sum(d.leftovers().values()) == 0, (name, transport)
        assert not list((platform.config.shm_dir / d.id).glob("[!.]*")), "request files left in shared memory"


def test_inline_switches_to_a_reference_transport_above_the_payload_limit(platform: LocalPlatform, bundles,
                                                                          reference, deploy) -> None:
    # a 3000-byte limit leaves room for no tensor of this bundle: all of them go through shared memory
    d = deploy(bundles.conv_channel, "inline", payload_limit_bytes=3000)
    client = MasterClient(d, platform.url, timeout_s=60)
    x = _inputs(bundles.conv_channel, 3)
    entries = client.channel.send(x, lambda n: TensorKey(d.id, "q-big", f"in.{n}"))
    ev = Event("infer", "q-big", d.id, now_ms() + 30_000, tuple(entries))
    reply = Reply.decode(client.invoker.invoke(d.master, ev.encode(), timeout_s=30))
    assert reply.error is None and reply.outputs[0].ref is not None and reply.outputs[0].ref.startswith("shm:")
    got = client.channel.receive(reply.outputs, delete=True)
    assert rel_err(got["y"], reference(bundles.conv_channel, x)["y"]) <= 1e-5
    client.channel.transports.delete(e.ref for e in entries if e.ref)
    client.close()
    assert sum(d.leftovers().values()) == 0


def test_vertical_slices_pass_tensors_worker_to_worker(platform: LocalPlatform, bundles, deploy) -> None:
    """chain: stage 0 on worker-1, stage 1 on worker-2, stage 2 split across both reading regions. Over
    shared memory the master never fetches the intermediate tensors: only the final tiles."""
    d = deploy(bundles.chain, "shm")
    client = MasterClient(d, platform.url, timeout_s=60)
    x = _inputs(bundles.chain, 0)
    entries = client.channel.send(x, lambda n: TensorKey(d.id, "q-vert", f"in.{n}"))
    ev = Event("infer", "q-vert", d.id, now_ms() + 30_000, tuple(entries))
    reply = Reply.decode(client.invoker.invoke(d.master, ev.encode(), timeout_s=30))
    assert reply.error is None
    y_bytes = int(np.prod(Plan.load(bundles.chain / "plan.json").model.outputs[0].shape)) * 4
    assert reply.timings["fetched_bytes"] == y_bytes  # the tiles of y, nothing else
    assert reply.timings["invocations"] == 4
    # the workers' own figures reach the master's reply, summed per stage (every stage here runs on workers)
    for stage in range(3):
        assert all(reply.timings[f"stage{stage}_workers_{k}"] >= 0 for k in ("read_ms", "run_ms", "write_ms"))
        assert reply.timings[f"stage{stage}_workers_run_ms"] > 0
    client.channel.receive(reply.outputs, delete=True)
    client.channel.transports.delete(e.ref for e in entries if e.ref)
    client.close()
    assert sum(d.leftovers().values()) == 0


@pytest.mark.parametrize("transport", ["shm", "redis"])
def test_32_concurrent_requests_get_their_own_outputs(platform: LocalPlatform, bundles, reference, deploy,
                                                      transport: str) -> None:
    bundle = bundles.chain
    d = deploy(bundle, transport, concurrency=4)
    client = MasterClient(d, platform.url, timeout_s=60)
    xs = [_inputs(bundle, 100 + i) for i in range(32)]
    with ThreadPoolExecutor(32) as pool:
        outs = list(pool.map(client.infer, xs))
    for x, got in zip(xs, outs, strict=True):
        assert rel_err(got["y"], reference(bundle, x)["y"]) <= 1e-5
    assert len({o["y"].tobytes() for o in outs}) == 32
    client.close()
    assert sum(d.leftovers().values()) == 0


def test_a_killed_worker_is_retried_and_the_request_succeeds(platform: LocalPlatform, bundles, reference,
                                                             deploy) -> None:
    bundle = bundles.slow
    d = deploy(bundle, "shm")
    client = MasterClient(d, platform.url, timeout_s=60)
    x = {"x": np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)}
    result: dict[str, object] = {}
    t = threading.Thread(target=lambda: result.update(out=client.infer_reply(x)))
    t.start()
    os.kill(wait_busy(platform, d.names["worker-1"]), signal.SIGKILL)
    t.join(120)
    got, reply = result["out"]  # type: ignore[misc]
    assert rel_err(got["y"], reference(bundle, x)["y"]) <= 1e-4
    # noticed from the platform's report that the instance died (not by the 60 s invocation timeout) and
    # sent again at once: the master records why the attempt failed
    assert reply.timings.get("attempts_failed_Crashed") == 1, reply.timings
    assert not any(k.startswith("attempts_failed_") and k != "attempts_failed_Crashed" for k in reply.timings)
    pool = platform.service.pool(d.names["worker-1"])
    # a spare counts as started at once, its cold start when it is up: wait for the spares started so far
    t_end = time.monotonic() + 60
    while pool._spares and time.monotonic() < t_end:
        time.sleep(0.01)
    u = platform.client.meter()["functions"][d.names["worker-1"]]
    # cold starts: the first instance and the dead one's replacement, which the retry waits for (no third
    # for the retry; a spare the pool keeps for the next death, if a cold start is slow here, is no wait)
    assert u["errors_by_type"] == {"Crashed": 1} and u["invocations"] == 2
    assert u["cold_starts"] - pool.spares_started == 2
    client.close()
    assert sum(d.leftovers().values()) == 0


@pytest.mark.parametrize("transport", ["shm", "redis"])
def test_a_killed_master_is_sent_again_and_leaves_no_tensors(platform: LocalPlatform, bundles, reference, deploy,
                                                             transport: str) -> None:
    bundle = bundles.slow
    d = deploy(bundle, transport)
    worker = d.names["worker-1"]
    client = MasterClient(d, platform.url, timeout_s=60)
    x = {"x": np.random.default_rng(1).standard_normal((512, 512)).astype(np.float32)}
    result: dict[str, object] = {}
    t = threading.Thread(target=lambda: result.update(out=client.infer(x)))
    t.start()
    wait_busy(platform, worker)  # the master has stored the part's input and waits for the worker
    os.kill(wait_busy(platform, d.master), signal.SIGKILL)
    t.join(120)
    got = result["out"]["y"]  # type: ignore[index]
    assert rel_err(got, reference(bundle, x)["y"]) <= 1e-4
    pool = platform.service.pool(d.master)
    t_end = time.monotonic() + 60  # a spare counts as started at once, its cold start when it is up
    while pool._spares and time.monotonic() < t_end:
        time.sleep(0.01)
    m = platform.client.meter()["functions"][d.master]
    # sent again at once, to the dead instance's replacement: one cold start for the death, not two (and
    # the spares the pool keeps while its instances die, which no request waited for)
    assert m["errors_by_type"] == {"Crashed": 1} and m["invocations"] == 2, m
    assert m["cold_starts"] - pool.spares_started == 2, (m["cold_starts"], pool.spares_started)

    # The dead attempt's worker invocation may still be running; once it has ended (its output stored
    # after the discard, and dropped), nothing of either attempt is left.
    def settled() -> bool:
        fn = platform.client.function(worker)
        return (platform.client.meter()["functions"][worker]["invocations"] == 2
                and not any(i["busy"] for i in fn["instances"]))

    t_end = time.monotonic() + 60
    while not settled() and time.monotonic() < t_end:
        time.sleep(0.01)
    assert settled(), "the dead attempt's worker invocation never ended"
    assert sum(d.leftovers().values()) == 0
    assert not list((platform.config.shm_dir / d.id).glob("[!.]*")), "request files left in shared memory"
    client.close()


def test_out_of_memory_reaches_the_master_and_is_not_retried(platform: LocalPlatform, bundles, deploy) -> None:
    d = deploy(bundles.hog(64 * 2**20, worker_memory_mb=192), "shm")
    client = MasterClient(d, platform.url, timeout_s=60)
    with pytest.raises(OutOfMemory, match="worker-1 ran out of memory"):
        client.infer({"x": np.ones(1, np.float32)})
    assert platform.client.meter()["functions"][d.names["worker-1"]]["invocations"] == 1
    client.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_redis_is_a_clear_error_not_a_hang(platform: LocalPlatform, bundles, deploy) -> None:
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    d = deploy(bundles.conv_channel, "inline", redis_url=url)  # inline client; the functions use Redis
    for name in d.names.values():  # redeploy the functions on Redis
        spec = platform.client.function(name)
        spec["env"]["FLATPACK_TRANSPORT"] = "redis"
        from serving.platform.spec import FunctionSpec

        platform.client.register(FunctionSpec.from_json(spec))
    client = MasterClient(d, platform.url, timeout_s=60)
    t0 = time.monotonic()
    with pytest.raises(TransportError, match=f"Redis at {url} is unreachable"):
        client.infer(_inputs(bundles.conv_channel, 0))
    assert time.monotonic() - t0 < 20
    client.close()


def test_a_deadline_ends_in_a_timeout_not_a_hang(platform: LocalPlatform, bundles, deploy) -> None:
    # "slower" is 128 chained 512 x 512 MatMuls (34 GFLOP): far past a 50 ms deadline even on a fast CI host,
    # where "slow" (6 GFLOP) once finished inside 0.3 s.
    d = deploy(bundles.slower, "shm")
    client = MasterClient(d, platform.url, timeout_s=0.05)
    t0 = time.monotonic()
    with pytest.raises(InvokeTimeout):
        client.infer({"x": np.ones((512, 512), np.float32)})
    assert time.monotonic() - t0 < 15
    client.close()


# -- the master in-process, over a direct invoker (no platform) --------------------------------------------


class DirectInvoker(Invoker):
    """Hands payloads straight to runtimes in this process."""

    def __init__(self) -> None:
        self.runtimes: dict[str, FunctionRuntime] = {}

    def invoke(self, function: str, payload: bytes, *, timeout_s: float) -> bytes:
        return self.runtimes[function].handle(payload)[0]


@pytest.mark.parametrize("name", BUNDLES)
def test_master_in_process(bundles, reference, shm_root: Path, name: str) -> None:
    bundle = getattr(bundles, name)
    plan = Plan.load(bundle / "plan.json")
    inv = DirectInvoker()
    for f in plan.functions:
        cfg = FunctionConfig(bundle_dir=bundle, deployment="inproc", function=f.name, transport="shm",
                             function_prefix="inproc-", shm_dir=shm_root)
        inv.runtimes[f"inproc-{f.name}"] = FunctionRuntime(cfg, invoker=inv)
    master = inv.runtimes["inproc-master"]
    x = _inputs(bundle, 7)
    ev = Event("infer", "q1", "inproc", now_ms() + 30_000, tuple(TensorEntry(k, data=encode(v)) for k, v in x.items()))
    reply = Reply.decode(master.handle(ev.encode())[0])
    assert reply.error is None, reply.error
    got = master.channel("binary").receive(reply.outputs, delete=True)
    for k, w in reference(bundle, x).items():
        assert rel_err(got[k], w) <= 1e-5
    assert ShmTransport(shm_root).count("inproc") == 0
    # a wrong deployment and a part sent to the wrong function are structured errors
    bad = Reply.decode(master.handle(Event("infer", "q2", "other", now_ms() + 1000).encode())[0])
    assert bad.error is not None and bad.error["type"] == "BadRequest"
    for rt in inv.runtimes.values():
        rt.close()


def _hedging_runtimes(bundle: Path, inv: DirectInvoker, shm_root: Path, deployment: str, prefix: str
                      ) -> FunctionRuntime:
    """``bundle``'s functions on ``inv``, hedging a part past the median of its durations after two calls;
    the master's runtime."""
    for f in Plan.load(bundle / "plan.json").functions:
        cfg = FunctionConfig(bundle_dir=bundle, deployment=deployment, function=f.name, transport="shm",
                             function_prefix=prefix, shm_dir=shm_root, hedge_percentile=50, hedge_min_samples=2)
        inv.runtimes[f"{prefix}{f.name}"] = FunctionRuntime(cfg, invoker=inv)
    return inv.runtimes[f"{prefix}master"]


def _three_then_late(master: FunctionRuntime, bundle: Path, reference, deployment: str) -> None:  # noqa: ANN001
    """Requests ``w0``-``w2`` (they teach the master the parts' durations), then ``late``: each answered
    exactly."""
    for rid in ("w0", "w1", "w2", "late"):
        x = _inputs(bundle, 3)
        ev = Event("infer", rid, deployment, now_ms() + 30_000,
                   tuple(TensorEntry(k, data=encode(v)) for k, v in x.items()))
        reply = Reply.decode(master.handle(ev.encode())[0])
        assert reply.error is None, reply.error
        got = master.channel("binary").receive(reply.outputs, delete=True)
        for k, w in reference(bundle, x).items():
            assert rel_err(got[k], w) <= 1e-5


class _LateCrash(DirectInvoker):
    """Attempt 0 of each part of request ``late`` stalls, stores an output as its worker would, then its
    instance dies: a hedge has won meanwhile and the request is over (its inputs deleted, so the real
    worker could not run now), and no reply ever names what it stored."""

    def __init__(self, shm: ShmTransport) -> None:
        super().__init__()
        self.shm = shm
        self.crashed = threading.Event()

    def invoke(self, function: str, payload: bytes, *, timeout_s: float) -> bytes:
        ev = Event.decode(payload)
        if ev.kind == "part" and ev.request_id == "late" and ev.attempt == 0:
            time.sleep(0.5)
            key = output_key(ev.deployment, ev.request_id, ev.stage, ev.part, ev.attempt, 0)
            self.shm.put(key, np.ones(4, np.float32))
            self.crashed.set()
            raise InstanceCrashed("killed after storing its outputs", function=function)
        return super().invoke(function, payload, timeout_s=timeout_s)


def test_a_hedge_that_dies_after_the_request_leaves_no_tensors(bundles, reference, shm_root: Path) -> None:
    bundle = bundles.conv_channel
    shm = ShmTransport(shm_root)
    inv = _LateCrash(shm)
    master = _hedging_runtimes(bundle, inv, shm_root, "latecrash", "lc-")
    try:
        _three_then_late(master, bundle, reference, "latecrash")
        assert inv.crashed.wait(10), "the stalled attempt never ran"
        t_end = time.monotonic() + 10
        while shm.count("latecrash") and time.monotonic() < t_end:
            time.sleep(0.01)
        assert shm.count("latecrash") == 0, "the dead hedge's outputs were left in shared memory"
    finally:
        for rt in inv.runtimes.values():
            rt.close()


class _LateWin(DirectInvoker):
    """Attempt 0 of each part of request ``late`` stalls, then runs as its worker would: a hedge has won
    meanwhile and the stage has settled. Each such attempt's reply (or what it raised) is kept."""

    def __init__(self) -> None:
        super().__init__()
        self.late: list[Reply | Exception] = []
        self.done = threading.Event()

    def invoke(self, function: str, payload: bytes, *, timeout_s: float) -> bytes:
        ev = Event.decode(payload)
        if ev.kind == "part" and ev.request_id == "late" and ev.attempt == 0:
            time.sleep(0.5)
            try:
                out = super().invoke(function, payload, timeout_s=timeout_s)
                self.late.append(Reply.decode(out))
                return out
            except Exception as e:
                self.late.append(e)
                raise
            finally:
                self.done.set()
        return super().invoke(function, payload, timeout_s=timeout_s)


@pytest.mark.parametrize("name", ["conv_channel", "relu_sum"])
def test_a_hedge_that_loses_still_reads_its_inputs_and_answers_without_an_error(bundles, reference, shm_root: Path,
                                                                                name: str) -> None:
    """The straggler a hedge beat keeps running after its stage has settled. Its inputs stay until it has
    answered (deleted under it, it failed, and the platform counted an error for a request that succeeded);
    then they go, with the outputs it stored. ``relu_sum``: the stage has an epilogue, after which the tensor
    its workers read (an earlier stage's output, read in place) is no longer needed."""
    bundle = getattr(bundles, name)
    plan = Plan.load(bundle / "plan.json")
    shm = ShmTransport(shm_root)
    inv = _LateWin()
    deployment = f"latewin-{name}"
    master = _hedging_runtimes(bundle, inv, shm_root, deployment, f"lw-{name}-")
    try:
        _three_then_late(master, bundle, reference, deployment)
        assert inv.done.wait(10), "the stalled attempt never ran"
        stalled = sum(len(s.parts) for s in plan.stages)
        t_end = time.monotonic() + 10
        while (len(inv.late) < stalled or shm.count(deployment)) and time.monotonic() < t_end:
            time.sleep(0.01)
        assert len(inv.late) == stalled, f"{len(inv.late)} of {stalled} stalled attempts answered"
        assert all(isinstance(r, Reply) and r.error is None for r in inv.late), inv.late
        assert shm.count(deployment) == 0, "the lost attempt's inputs or outputs were left in shared memory"
    finally:
        for rt in inv.runtimes.values():
            rt.close()


# -- the policy on its own ---------------------------------------------------------------------------------


class ScriptedInvoker(Invoker):
    """Each call takes the next (delay_s, outcome) from a script; outcome is an exception or a reply."""

    def __init__(self, script: list[tuple[float, object]]) -> None:
        self.script = list(script)
        self.calls: list[int] = []
        self._lock = threading.Lock()

    def invoke(self, function: str, payload: bytes, *, timeout_s: float) -> bytes:
        with self._lock:
            n = len(self.calls)
            self.calls.append(int(payload))
            delay, outcome = self.script[min(n, len(self.script) - 1)]
        time.sleep(min(delay, timeout_s))
        if delay > timeout_s:
            raise InvokeTimeout("scripted timeout", function=function)
        if isinstance(outcome, BaseException):
            raise outcome
        return Reply(timings={"attempt": float(int(payload))}).encode()


def _call(inv: Invoker, policy: InvokePolicy, *, deadline_s: float = 10, key: CallKey | None = None,
          discard=None) -> Reply:
    return PolicyInvoker(inv, policy).call("f", lambda a: str(a).encode(), deadline=time.time() + deadline_s, key=key,
                                           discard=discard)


def test_retries_are_bounded() -> None:
    inv = ScriptedInvoker([(0, InstanceCrashed("boom"))])
    with pytest.raises(InstanceCrashed, match="gave up after 3 attempts"):
        _call(inv, InvokePolicy(max_retries=2, backoff_s=0))
    assert inv.calls == [0, 1, 2]


def test_a_retry_succeeds() -> None:
    inv = ScriptedInvoker([(0, InstanceCrashed("boom")), (0, None)])
    assert _call(inv, InvokePolicy(max_retries=2, backoff_s=0)).timings["attempt"] == 1


@pytest.mark.parametrize("err", [PartError("bad input"), OutOfMemory("too big")])
def test_deterministic_failures_are_not_retried(err: FunctionError) -> None:
    inv = ScriptedInvoker([(0, err)])
    with pytest.raises(type(err)):
        _call(inv, InvokePolicy(max_retries=3, backoff_s=0))
    assert inv.calls == [0]


def test_structured_errors_in_replies_are_raised() -> None:
    class ErrorReply(Invoker):
        def invoke(self, function: str, payload: bytes, *, timeout_s: float) -> bytes:
            return Reply(error={"type": "PartError", "message": "onnxruntime said no"}).encode()

    with pytest.raises(PartError, match="onnxruntime said no"):
        _call(ErrorReply(), InvokePolicy())
    assert isinstance(error_from_json({"type": "Nonsense", "message": "m"}), FunctionError)


def test_timeouts_are_retried_within_the_deadline() -> None:
    inv = ScriptedInvoker([(5.0, None), (0, None)])
    t0 = time.monotonic()
    assert _call(inv, InvokePolicy(timeout_s=0.1, backoff_s=0)).timings["attempt"] == 1
    assert time.monotonic() - t0 < 2


def test_the_deadline_bounds_everything() -> None:
    inv = ScriptedInvoker([(30.0, None)])
    t0 = time.monotonic()
    with pytest.raises(InvokeTimeout):
        _call(inv, InvokePolicy(timeout_s=60, max_retries=5), deadline_s=0.3)
    assert time.monotonic() - t0 < 1.5


def test_hedging_re_invokes_a_straggler_and_discards_the_loser() -> None:
    key = CallKey("f", 0, 0)
    policy = InvokePolicy(hedge_percentile=90, hedge_min_samples=5, backoff_s=0)
    pinv = PolicyInvoker(ScriptedInvoker([(0.01, None)]), policy)
    for _ in range(5):  # learn the part's usual duration (~10 ms)
        pinv.call("f", lambda a: str(a).encode(), deadline=time.time() + 5, key=key)
    slow_then_fast = ScriptedInvoker([(1.0, None), (0.01, None)])
    pinv.invoker = slow_then_fast
    discarded: list[Reply] = []
    t0 = time.monotonic()
    reply = pinv.call("f", lambda a: str(a).encode(), deadline=time.time() + 5, key=key, discard=discarded.append)
    assert reply.timings["attempt"] == 1 and time.monotonic() - t0 < 0.5  # the hedge won
    time.sleep(1.2)
    assert [r.timings["attempt"] for r in discarded] == [0]  # the straggler's reply was handed back


def test_a_shift_that_slows_every_call_hedges_only_the_budgets_share() -> None:
    """Durations learned from quick calls; then the machine slows and every call runs past the old
    percentile. Hedging them all would double the load (on a platform, a cold instance per hedge): the
    policy hedges at most its budget's share of the part's recent calls."""
    key = CallKey("f", 0, 0)
    policy = InvokePolicy(hedge_percentile=90, hedge_min_samples=5, backoff_s=0, hedge_budget=0.1)
    pinv = PolicyInvoker(ScriptedInvoker([(0.01, None)]), policy)
    for _ in range(5):
        pinv.call("f", lambda a: str(a).encode(), deadline=time.time() + 5, key=key)
    slow = ScriptedInvoker([(0.2, None)])
    pinv.invoker = slow
    calls = 12
    for _ in range(calls):
        pinv.call("f", lambda a: str(a).encode(), deadline=time.time() + 10, key=key)
    hedges = len(slow.calls) - calls
    assert 1 <= hedges <= 3, slow.calls  # 12 without the budget
    assert pinv.stats.hedged_share(key) <= 0.1 + 1 / (5 + calls)


def test_a_call_that_may_not_be_hedged_waits_for_its_straggler() -> None:
    key = CallKey("f", 0, 0)
    policy = InvokePolicy(hedge_percentile=90, hedge_min_samples=5, backoff_s=0)
    pinv = PolicyInvoker(ScriptedInvoker([(0.01, None)]), policy)
    for _ in range(5):
        pinv.call("f", lambda a: str(a).encode(), deadline=time.time() + 5, key=key)
    slow_then_fast = ScriptedInvoker([(0.3, None), (0.01, None)])
    pinv.invoker = slow_then_fast
    reply = pinv.call("f", lambda a: str(a).encode(), deadline=time.time() + 5, key=key, hedge=False)
    assert reply.timings["attempt"] == 0 and slow_then_fast.calls == [0]


def test_a_lost_attempt_that_fails_later_is_reported_with_its_number() -> None:
    """The hedge wins; the straggler it beat then dies: ``lost`` hears its number (its outputs may be
    stored with no reply naming them), and ``failed`` hears of nothing (the call was over)."""
    key = CallKey("f", 0, 0)
    policy = InvokePolicy(hedge_percentile=90, hedge_min_samples=5, backoff_s=0)
    pinv = PolicyInvoker(ScriptedInvoker([(0.01, None)]), policy)
    for _ in range(5):
        pinv.call("f", lambda a: str(a).encode(), deadline=time.time() + 5, key=key)
    pinv.invoker = ScriptedInvoker([(0.5, InstanceCrashed("killed")), (0.01, None)])
    lost: list[int] = []
    failed: list[tuple[int, str]] = []
    reply = pinv.call("f", lambda a: str(a).encode(), deadline=time.time() + 5, key=key, lost=lost.append,
                      failed=lambda n, e: failed.append((n, e.type)))
    assert reply.timings["attempt"] == 1
    t_end = time.monotonic() + 5
    while not lost and time.monotonic() < t_end:
        time.sleep(0.01)
    assert lost == [0] and failed == []


def test_an_attempt_whose_reply_no_thread_has_started_to_read_is_still_discarded() -> None:
    """The call ends while an attempt it sent waits for a pool thread (here: the only one is busy). That
    attempt's reply is read when a thread is free and handed to ``discard``: its worker stored its outputs
    before it answered, and nothing else names them."""
    import threading

    pinv = PolicyInvoker(ScriptedInvoker([(0, None)]), InvokePolicy(), max_workers=1)
    busy = threading.Event()
    blocker = pinv._pool.submit(busy.wait, 10)
    discarded: list[Reply] = []
    call = pinv.start("f", lambda a: str(a).encode(), deadline=time.time() + 10, discard=discarded.append)
    call.abandon()
    busy.set()
    blocker.result(timeout=10)
    t_end = time.monotonic() + 10
    while not discarded and time.monotonic() < t_end:
        time.sleep(0.01)
    assert [r.timings["attempt"] for r in discarded] == [0]


def test_failed_attempts_are_reported_with_their_kind() -> None:
    inv = ScriptedInvoker([(0, InstanceCrashed("boom")), (0, None)])
    failed: list[tuple[int, str]] = []
    PolicyInvoker(inv, InvokePolicy(backoff_s=10)).call(
        "f", lambda a: str(a).encode(), deadline=time.time() + 60, failed=lambda n, e: failed.append((n, e.type)))
    assert failed == [(0, "Crashed")] and inv.calls == [0, 1]


# -- the handlers for each target ---------------------------------------------------------------------------


def test_lambda_and_openfaas_handlers(bundles, reference, monkeypatch: pytest.MonkeyPatch) -> None:
    import functions.handlers.aws_lambda as lam
    import functions.handlers.openfaas as faas
    from functions.codec import decode

    bundle = bundles.tiny
    cfg = FunctionConfig(bundle_dir=bundle, deployment="h", function="worker-1", transport="inline")
    for k, v in cfg.to_env().items():
        monkeypatch.setenv(k, v)
    from functions.handlers.instance import Instance

    monkeypatch.setattr(lam, "_instance", Instance())
    monkeypatch.setattr(faas, "_instance", Instance())
    x = {"x": np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)}
    want = reference(bundle, x)["y"]
    ev = Event("part", "q", "h", now_ms() + 10_000, (TensorEntry("x", data=encode(x["x"])),), stage=0, part=0)

    class Context:
        def get_remaining_time_in_millis(self) -> int:
            return 5000

    doc = lam.handler(ev.to_json_doc(), Context())  # the Lambda runtime hands over parsed JSON
    assert "error" not in doc
    np.testing.assert_array_equal(decode(Reply.from_doc(doc).outputs[0].data), want)  # type: ignore[arg-type]

    class Req:
        body = ev.encode("binary")

    res = faas.handle(Req(), None)
    assert res["statusCode"] == 200
    np.testing.assert_array_equal(decode(Reply.decode(res["body"]).outputs[0].data), want)  # type: ignore[arg-type]
    bad = faas.handle(type("R", (), {"body": b"garbage"})(), None)
    assert bad["statusCode"] == 500 and Reply.decode(bad["body"]).error["type"] == "BadRequest"  # type: ignore[index]


def test_an_epilogue_reads_a_tensor_an_earlier_worker_left_by_reference(platform: LocalPlatform, deploy,
                                                                         tmp_path: Path) -> None:
    """Every stage on workers: the embeddings' worker leaves its output in shared memory, the attention stage's
    two head workers read it by reference, and the master's epilogue adds it back (the residual) after the
    heads' sum. The master keeps the tensor until that epilogue has read it: the answer equals the model's,
    and nothing is left in shared memory."""
    import onnxruntime as ort

    from partitioner.export import Placement, export_bundle
    from partitioner.graph import LayerGraph
    from partitioner.inputs import random_inputs
    from partitioner.spec import parse_stages
    from zoo import build_to_file

    path = build_to_file("bert", tmp_path / "bert.onnx", layers=1, hidden=32, heads=2, seq_len=8, vocab=64)
    lg = LayerGraph.load(path)
    stages = parse_stages("0-1:none,2:heads=2,3:none", len(lg.units))
    bundle = tmp_path / "bundle"
    export_bundle(lg, stages, bundle, placements=[Placement(False, 256)] * len(stages), master_mb=256)
    d = deploy(bundle, "shm")
    client = MasterClient(d, platform.url, timeout_s=60)
    x = random_inputs(lg.model, 0)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, x)
    try:
        for _ in range(2):
            got = client.infer(x)
            (y,) = got.values()
            assert np.abs(y - want[0]).max() <= 1e-4 * max(1.0, float(np.abs(want[0]).max()))
    finally:
        client.close()
    assert not list((platform.config.shm_dir / d.id).glob("[!.]*")), "request files left in shared memory"

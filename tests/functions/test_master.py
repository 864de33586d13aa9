"""The master's stage loop, in one process: every function of a hand-built bundle is a real
:class:`functions.runtime.FunctionRuntime`, and the invoker hands each event straight to the runtime it
names (the seam every target's invoker implements), recording what it was asked.

Checked: stage by stage, the parts on other functions are invoked once each and the master's own parts
run in its process; a stage held wholly by one worker leaves its output in the transport and the next
stage gets the reference; the join and epilogue give the unsplit model's outputs; a failing part fails
the request with the part's error; and nothing the request put in the transport outlives it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from functions.codec import encode
from functions.compare import rel_err
from functions.config import FunctionConfig
from functions.errors import InstanceCrashed, PartError
from functions.event import Event, Reply, TensorEntry, now_ms
from functions.invoker.base import Invoker
from functions.master import cheap_to_duplicate
from functions.plan import Plan
from functions.runtime import FunctionRuntime
from functions.transport.shm import ShmTransport
from tests.conftest import _model

DEPLOYMENT = "unit"


class InProcessInvoker(Invoker):
    """Runs each invocation on the named runtime; records (function, stage, part, input refs) per call, and
    fails the parts named in ``failing`` with a PartError as a worker would report it."""

    def __init__(self) -> None:
        self.runtimes: dict[str, FunctionRuntime] = {}
        self.calls: list[tuple[str, int | None, int | None, tuple[str | None, ...]]] = []
        self.failing: set[tuple[int, int]] = set()
        self._lock = threading.Lock()

    def invoke(self, function: str, payload: bytes, *, timeout_s: float) -> bytes:
        event = Event.decode(payload)
        with self._lock:
            self.calls.append((function, event.stage, event.part, tuple(e.ref for e in event.inputs)))
        if (event.stage, event.part) in self.failing:
            return Reply.failure(PartError(f"part {event.part} broke", function=function)).encode()
        return self.runtimes[function].handle(payload)[0]


class Deployed:
    def __init__(self, bundle: Path, shm: Path, invoker: InProcessInvoker | None = None, **config: Any) -> None:
        self.bundle = bundle
        self.plan = Plan.load(bundle / "plan.json")
        self.shm = ShmTransport(shm)
        self.invoker = invoker or InProcessInvoker()
        for f in self.plan.functions:
            cfg = FunctionConfig(bundle_dir=bundle, deployment=DEPLOYMENT, function=f.name, transport="shm",
                                 function_prefix=f"{DEPLOYMENT}-", shm_dir=shm, **config)
            self.invoker.runtimes[f"{DEPLOYMENT}-{f.name}"] = FunctionRuntime(cfg, invoker=self.invoker)
        self.master = self.invoker.runtimes[f"{DEPLOYMENT}-{self.plan.master}"]

    def infer(self, x: dict[str, np.ndarray], request_id: str = "r1") -> tuple[Reply, dict[str, np.ndarray]]:
        ev = Event("infer", request_id, DEPLOYMENT, now_ms() + 30_000,
                   tuple(TensorEntry(k, data=encode(v)) for k, v in x.items()))
        reply = Reply.decode(self.master.handle(ev.encode())[0])
        if reply.error is not None:
            return reply, {}
        return reply, self.master.channel("binary").receive(reply.outputs, delete=True)

    def inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        return {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in self.plan.model.inputs}

    def close(self) -> None:
        for rt in self.invoker.runtimes.values():
            rt.close()


@pytest.fixture
def deployed(shm_root: Path, tmp_path: Path) -> Iterator:
    made: list[Deployed] = []

    def _deploy(bundle: Path, invoker: InProcessInvoker | None = None, **config: Any) -> Deployed:
        d = Deployed(bundle, shm_root / tmp_path.name, invoker, **config)
        made.append(d)
        return d

    yield _deploy
    for d in made:
        d.close()


def _check_outputs(d: Deployed, got: dict[str, np.ndarray], x: dict[str, np.ndarray], reference) -> None:
    want = reference(d.bundle, x)
    assert set(got) == set(want)
    for name, w in want.items():
        assert rel_err(got[name], w) <= 1e-5, name


def test_each_stage_forks_its_parts_to_their_functions_and_joins_them(bundles, reference, deployed) -> None:
    d = deployed(bundles.conv_channel)
    x = d.inputs()
    reply, got = d.infer(x)
    assert reply.error is None, reply.error
    _check_outputs(d, got, x, reference)
    assert sorted((f, s, p) for f, s, p, _ in d.invoker.calls) == [("unit-worker-1", 0, 0), ("unit-worker-2", 0, 1)]
    assert reply.timings["invocations"] == 2 and "stage0_ms" in reply.timings
    # the master's own CPU over the request (what its share stretches), within its stages' and beyond
    assert reply.timings["cpu_ms"] >= reply.timings["stage0_cpu_ms"] > 0
    names = {(s.name, s.stage, s.part) for s in reply.trace}
    assert {("invoke", 0, 0), ("invoke", 0, 1), ("stage", 0, None), ("join", 0, None)} <= names
    assert d.shm.count(DEPLOYMENT) == 0  # inputs put for the parts and their outputs: all deleted


def test_a_part_on_the_master_runs_in_its_own_process(bundles, reference, deployed) -> None:
    d = deployed(bundles.conv_channel_master)
    x = d.inputs(1)
    reply, got = d.infer(x)
    assert reply.error is None, reply.error
    _check_outputs(d, got, x, reference)
    assert [(f, s, p) for f, s, p, _ in d.invoker.calls] == [("unit-worker-1", 0, 1)]
    assert ("compute", 0, 0) in {(s.name, s.stage, s.part) for s in reply.trace}


def _no_tensors_left(d: Deployed, within_s: float = 10.0) -> None:
    """Nothing of the deployment's is left in shared memory, once the attempts still running have ended."""
    t_end = time.monotonic() + within_s
    while d.shm.count(DEPLOYMENT) and time.monotonic() < t_end:
        time.sleep(0.01)
    assert d.shm.count(DEPLOYMENT) == 0


def _infer_with_local_hook(d: Deployed, reference, before_local: Callable[[], Any]) -> Reply:
    """One request whose parts on the master call ``before_local`` first; its outputs are checked."""
    sessions = d.master.sessions
    run = sessions.run

    def hooked(path: Any, inputs: Any) -> Any:
        before_local()
        return run(path, inputs)

    sessions.run = hooked  # type: ignore[method-assign]
    x = d.inputs(1)
    reply, got = d.infer(x)
    assert reply.error is None, reply.error
    _check_outputs(d, got, x, reference)
    return reply


class SendingInvoker(InProcessInvoker):
    """Logs when each invocation is sent (``start``, in the master's own thread, as the HTTP invokers put the
    request on the wire there) beside when the master's own parts run."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    def start(self, function: str, payload: bytes, *, timeout_s: float) -> Callable[[], bytes]:
        event = Event.decode(payload)
        self.log.append(f"sent s{event.stage}p{event.part} from {threading.current_thread().name}")
        return super().start(function, payload, timeout_s=timeout_s)


def test_a_stages_invocations_are_sent_before_the_master_computes_its_own_part(bundles, reference, deployed
                                                                               ) -> None:
    log: list[str] = []
    d = deployed(bundles.conv_channel_master, SendingInvoker(log))
    _infer_with_local_hook(d, reference, lambda: log.append(f"local from {threading.current_thread().name}"))
    me = threading.current_thread().name
    assert log[0] == f"sent s0p1 from {me}" and log[1].startswith("local from"), log


class _CrashingOnce(InProcessInvoker):
    """Attempt 0 of the parts in ``crash`` answers as the platform does when it sees the instance die; the
    retry of each sets ``retried``."""

    def __init__(self, crash: set[tuple[int, int]]) -> None:
        super().__init__()
        self.crash = crash
        self.retried = threading.Event()

    def invoke(self, function: str, payload: bytes, *, timeout_s: float) -> bytes:
        ev = Event.decode(payload)
        if (ev.stage, ev.part) in self.crash:
            if ev.attempt == 0:
                return Reply.failure(InstanceCrashed("the instance died (signal 9)", function=function)).encode()
            self.retried.set()
        return super().invoke(function, payload, timeout_s=timeout_s)


def test_a_crashed_worker_is_retried_while_the_master_computes_its_own_part(bundles, reference, deployed) -> None:
    """One thread waits for all of a stage's parts; the master's own part runs beside it, so a worker the
    platform reports dead is invoked again at once, not after the master's part is done."""
    inv = _CrashingOnce({(0, 1)})
    d = deployed(bundles.conv_channel_master, inv)
    seen: list[bool] = []
    reply = _infer_with_local_hook(d, reference, lambda: seen.append(inv.retried.wait(timeout=30)))
    assert seen == [True], "the crashed part was retried only after the master's own part"
    assert reply.timings.get("attempts_failed_Crashed") == 1
    (failed,) = [s for s in reply.trace if s.name == "failed"]  # the dead attempt, in the waterfall
    assert (failed.stage, failed.part) == (0, 1)
    (retry,) = [s for s in reply.trace if s.name == "invoke" and (s.stage, s.part) == (0, 1)]
    assert failed.start_ms <= failed.end_ms <= retry.start_ms + 1e-6  # the retry was sent once it failed
    assert d.shm.count(DEPLOYMENT) == 0


def test_partial_sums_are_added_and_the_epilogue_runs_on_the_master(bundles, reference, deployed) -> None:
    d = deployed(bundles.matmul_sum)
    x = d.inputs(2)
    reply, got = d.infer(x)
    assert reply.error is None, reply.error
    _check_outputs(d, got, x, reference)
    assert ("epilogue", 0, None) in {(s.name, s.stage, s.part) for s in reply.trace}


def test_a_whole_stage_on_one_worker_passes_its_output_on_by_reference(bundles, reference, deployed) -> None:
    """chain: stage 0 on worker-1, stage 1 on worker-2, then a 2x1 spatial split: stage 1's event carries
    a reference to stage 0's output (worker to worker), never the values through the master."""
    d = deployed(bundles.chain)
    x = d.inputs(3)
    reply, got = d.infer(x)
    assert reply.error is None, reply.error
    _check_outputs(d, got, x, reference)
    calls = sorted(d.invoker.calls, key=lambda c: (c[1], c[2]))
    assert [(f, s, p) for f, s, p, _ in calls] == [
        ("unit-worker-1", 0, 0), ("unit-worker-2", 1, 0), ("unit-worker-1", 2, 0), ("unit-worker-2", 2, 1)]
    assert calls[1][3][0] is not None  # stage 1's input is a reference
    assert [f"stage{i}_ms" in reply.timings for i in range(3)] == [True] * 3
    assert reply.timings["invocations"] == 4
    assert d.shm.count(DEPLOYMENT) == 0  # the remote tensors are deleted after their last use


def test_a_failing_part_fails_the_request_and_leaves_no_tensors(bundles, deployed) -> None:
    d = deployed(bundles.chain)
    d.invoker.failing = {(2, 1)}
    reply, _ = d.infer(d.inputs(4))
    assert reply.error is not None and reply.error["type"] == "PartError"
    assert "part 1 broke" in reply.error["message"]
    assert not [c for c in d.invoker.calls if c[1] is not None and c[1] > 2]
    # the request fails as soon as one part does; a part of its stage still running is discarded when it ends
    _no_tensors_left(d)
    d.invoker.failing = set()
    reply, _ = d.infer(d.inputs(4), request_id="r2")  # the next request on the same instances runs
    assert reply.error is None, reply.error


class _Stalling(InProcessInvoker):
    """Also records each call's attempt number; attempt 0 of the parts in ``stall`` of request ``slow``
    waits ``stall_s`` first (a straggler)."""

    def __init__(self, stall: set[tuple[int, int]], stall_s: float) -> None:
        super().__init__()
        self.stall, self.stall_s = stall, stall_s
        self.attempts: list[tuple[str, int | None, int | None, int]] = []

    def invoke(self, function: str, payload: bytes, *, timeout_s: float) -> bytes:
        ev = Event.decode(payload)
        with self._lock:
            self.attempts.append((ev.request_id, ev.stage, ev.part, ev.attempt))
        if ev.request_id == "slow" and ev.attempt == 0 and (ev.stage, ev.part) in self.stall:
            time.sleep(self.stall_s)
        return super().invoke(function, payload, timeout_s=timeout_s)


def test_hedging_is_on_by_default_for_split_stages_only(bundles, reference, deployed) -> None:
    """chain: stages 0 and 1 each run whole on one worker (a duplicate would cost the stage again), stage 2
    is a 2x1 spatial split (a duplicate re-runs half of it). With the default config the master hedges
    stage 2's straggler and waits for stage 0's."""
    assert FunctionConfig(bundle_dir=bundles.chain, deployment="d", function="master").hedge_percentile == 95.0
    inv = _Stalling({(0, 0), (2, 0)}, stall_s=1.0)
    # the warm calls give the durations the percentile is taken from, and none of them can be hedged (each
    # finds fewer than that many before it): on a loaded machine a warm call past the percentile of the few
    # before it was hedged too, and the policy hedges at most a tenth of a part's recent calls
    warm = 10
    d = deployed(bundles.chain, inv, hedge_min_samples=warm)
    plan = d.plan
    assert [cheap_to_duplicate(st, d.bundle) for st in plan.stages] == [False, False, True]
    assert not cheap_to_duplicate(plan.stages[2], d.bundle, max_part_bytes=16)  # parts too big to load twice
    for i in range(warm):
        reply, _ = d.infer(d.inputs(i), request_id=f"w{i}")
        assert reply.error is None, reply.error
    x = d.inputs(9)
    reply, got = d.infer(x, request_id="slow")
    assert reply.error is None, reply.error
    _check_outputs(d, got, x, reference)
    slow = [(s, p, a) for r, s, p, a in inv.attempts if r == "slow"]
    warm_hedges = [(r, s, p) for r, s, p, a in inv.attempts if r != "slow" and a]
    assert (2, 0, 1) in slow, f"stage 2's straggler was not hedged: {slow} (warm calls hedged: {warm_hedges})"
    assert [a for s, p, a in slow if (s, p) == (0, 0)] == [0], "a whole-stage part was hedged"
    _no_tensors_left(d)  # the straggler that lost still finishes; its outputs are deleted then


def test_hedging_can_be_turned_off(bundles, deployed) -> None:
    inv = _Stalling({(2, 0)}, stall_s=0.3)
    d = deployed(bundles.chain, inv, hedge_min_samples=3, hedge_percentile=None)
    for i in range(4):
        assert d.infer(d.inputs(i), request_id=f"w{i}")[0].error is None
    assert d.infer(d.inputs(9), request_id="slow")[0].error is None
    assert [a for r, s, p, a in inv.attempts if r == "slow" and (s, p) == (2, 0)] == [0]


CNN = [{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 6}, {"op": "MaxPool", "k": (2, 2), "s": (2, 2)},
       {"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 4}]


@pytest.fixture(scope="module")
def two_spatial(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """conv+pool split 2x2, then a conv split 2x1 (tiles with halos) of the joined tensor, every part on a
    worker of its own."""
    from partitioner.export import Placement, export_bundle
    from tests.onnx_builders import conv_stack

    d = tmp_path_factory.mktemp("spatial")
    return export_bundle(conv_stack(CNN, cin=3, h=16, w=16), "0:spatial=2x2,1:spatial=2x1", d / "bundle",
                         placements=[Placement(master_part=False), Placement(master_part=False)])


def test_a_spatial_split_stores_the_tensor_once_and_each_part_reads_its_region(two_spatial, reference,
                                                                              deployed) -> None:
    """Stage 1's tiles (with halos) of the joined tensor: one stored tensor, each part's event naming it with
    its own region; the outputs equal the in-process executor's bit for bit, and nothing is left."""
    from functions.executor import InProcessRunner

    d = deployed(two_spatial)
    assert [len(st.parts) for st in d.plan.stages] == [4, 2]
    x = d.inputs(5)
    reply, got = d.infer(x)
    assert reply.error is None, reply.error
    _check_outputs(d, got, x, reference)
    want = InProcessRunner(two_spatial).execute(d.plan, x)
    assert all(np.array_equal(got[k], v) for k, v in want.items())
    refs = {p: r for f, s, p, r in d.invoker.calls if s == 1}
    assert len(refs) == 2 and refs[0] == refs[1] and refs[0][0] is not None
    assert d.shm.count(DEPLOYMENT) == 0


def test_whole_of_tells_a_region_view_from_anything_else() -> None:
    from functions.master import _whole_of

    whole = np.arange(2 * 3 * 8 * 6, dtype=np.float32).reshape(2, 3, 8, 6).copy()  # owns its data, as a join's
    region = ((0, 2), (0, 3), (2, 7), (1, 6))
    assert _whole_of(whole[0:2, 0:3, 2:7, 1:6], region) is whole
    full = ((0, 2), (0, 3), (0, 8), (0, 6))
    assert _whole_of(whole[:, :, :, :], full) is whole
    assert _whole_of(whole[0:2, 0:3, 2:7, 1:6], ((0, 2), (0, 3), (3, 8), (1, 6))) is None  # another region
    assert _whole_of(whole[:, :, ::2, :], ((0, 2), (0, 3), (0, 4), (0, 6))) is None  # strided
    assert _whole_of(whole.copy(), full) is None  # owns its data
    assert _whole_of(whole.reshape(-1)[:10], ((0, 10),)) is None  # cut from a tensor of another shape
    assert _whole_of(np.arange(48.0).reshape(8, 6)[2:5], ((2, 5), (0, 6))) is None  # the owner is 1-d
    assert _whole_of(whole.transpose(0, 1, 3, 2)[:, :, :6, :8], ((0, 2), (0, 3), (0, 6), (0, 8))) is None


def test_inputs_in_shared_memory_are_read_by_the_parts_where_the_caller_put_them(two_spatial, reference,
                                                                                 deployed) -> None:
    """The caller stores the input in shared memory (as the endpoint does): stage 0's parts get the caller's
    reference with their regions, the master copies nothing, and deletes it after its last use."""
    from functions.executor import InProcessRunner
    from functions.transport.base import TensorKey

    d = deployed(two_spatial)
    x = d.inputs(6)
    (name, arr), = x.items()
    ref = d.shm.put(TensorKey(DEPLOYMENT, "r1", "in.x"), arr)
    ev = Event("infer", "r1", DEPLOYMENT, now_ms() + 30_000,
               (TensorEntry(name, ref=ref, dtype=arr.dtype.name, shape=arr.shape),))
    reply = Reply.decode(d.master.handle(ev.encode())[0])
    assert reply.error is None, reply.error
    got = d.master.channel("binary").receive(reply.outputs, delete=True)
    want = InProcessRunner(two_spatial).execute(d.plan, x)
    assert all(np.array_equal(got[k], v) for k, v in want.items())
    _check_outputs(d, got, x, reference)
    assert {r for f, s, p, r in d.invoker.calls if s == 0} == {(ref,)}
    assert d.shm.count(DEPLOYMENT) == 0
    # an input whose declared shape is not the plan's is received as before (and refused there, clearly)
    ref = d.shm.put(TensorKey(DEPLOYMENT, "r2", "in.x"), arr[:, :, :8])
    ev = Event("infer", "r2", DEPLOYMENT, now_ms() + 30_000,
               (TensorEntry(name, ref=ref, dtype=arr.dtype.name, shape=arr[:, :, :8].shape),))
    reply = Reply.decode(d.master.handle(ev.encode())[0])
    assert reply.error is not None
    assert d.shm.count(DEPLOYMENT) == 0


# --- an instance is built warm -------------------------------------------------------------------------------


def test_an_instance_opens_its_transport_and_runs_its_parts_once_before_its_first_event(
        bundles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the first event would otherwise build is built in the cold start: on a prewarmed instance at
    0.29 vCPU the first request's input read took 80-130 ms (opening the transport) and its run 20 ms
    (onnxruntime's first run)."""
    from functions.session import SessionCache

    plan = Plan.load(bundles.conv_channel / "plan.json")
    worker = next(f.name for f in plan.functions if f.name != plan.master)
    cfg = FunctionConfig(bundle_dir=bundles.conv_channel, deployment=DEPLOYMENT, function=worker, transport="shm",
                         function_prefix=f"{DEPLOYMENT}-", shm_dir=tmp_path)
    runs: list[str] = []

    class Counting(SessionCache):
        def run(self, path, inputs):  # type: ignore[no-untyped-def]
            runs.append(str(path))
            return super().run(path, inputs)

        def warm_up(self, path) -> bool:  # type: ignore[no-untyped-def]
            ok = super().warm_up(path)
            runs.append(f"warm {path}")
            return ok

    monkeypatch.setattr("functions.runtime.make_session_cache", lambda *a, **k: Counting())
    rt = FunctionRuntime(cfg)
    assert rt.transports.opened == ["shm"]
    assert runs and all(r.startswith("warm ") for r in runs)  # every part it runs, once, before any event


def test_a_warm_up_runs_a_part_on_zeros_where_it_can_and_never_fails_its_load(tmp_path: Path) -> None:
    from functions.session import SessionCache

    static = tmp_path / "static.onnx"
    onnx.save(_model([helper.make_node("Relu", ["x"], ["y"])], {"x": (1, 4)}, {"y": (1, 4)}, {}), str(static))
    dynamic = tmp_path / "dynamic.onnx"
    onnx.save(_model([helper.make_node("Relu", ["x"], ["y"])], {"x": ("n", 4)}, {"y": ("n", 4)}, {}), str(dynamic))
    # a shape tensor among the inputs: [0] (the first dimension kept) is no shape for 6 elements
    shaped = helper.make_model(helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("s", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 17)])
    shaped.ir_version = 8
    onnx.save(shaped, str(tmp_path / "shaped.onnx"))
    cache = SessionCache()
    assert cache.warm_up(static) is True
    assert cache.warm_up(dynamic) is False
    assert cache.warm_up(tmp_path / "shaped.onnx") is False
    got = cache.run(tmp_path / "shaped.onnx", {"x": np.ones((2, 3), np.float32), "s": np.array([6])})["y"]
    assert got.shape == (6,)  # loaded all the same, and runs

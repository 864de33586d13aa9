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
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from functions.codec import encode
from functions.compare import rel_err
from functions.config import FunctionConfig
from functions.errors import PartError
from functions.event import Event, Reply, TensorEntry, now_ms
from functions.invoker.base import Invoker
from functions.plan import Plan
from functions.runtime import FunctionRuntime
from functions.transport.shm import ShmTransport

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
    def __init__(self, bundle: Path, shm: Path) -> None:
        self.bundle = bundle
        self.plan = Plan.load(bundle / "plan.json")
        self.shm = ShmTransport(shm)
        self.invoker = InProcessInvoker()
        for f in self.plan.functions:
            cfg = FunctionConfig(bundle_dir=bundle, deployment=DEPLOYMENT, function=f.name, transport="shm",
                                 function_prefix=f"{DEPLOYMENT}-", shm_dir=shm)
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

    def _deploy(bundle: Path) -> Deployed:
        d = Deployed(bundle, shm_root / tmp_path.name)
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
    assert d.shm.count(DEPLOYMENT) == 0
    d.invoker.failing = set()
    reply, _ = d.infer(d.inputs(4), request_id="r2")  # the next request on the same instances runs
    assert reply.error is None, reply.error

"""The master: runs a plan for one request, stage by stage, with fork-join across worker functions.

Built on :func:`functions.executor.execute_plan` (the same loop the in-process executor uses): for each
stage it slices the input regions of the parts, invokes the parts' functions concurrently (running the
parts assigned to the master itself in its own process meanwhile), joins (tiles placed, channels
concatenated, partial sums added), runs the epilogue, and goes on: Gillis's multi-round fork-join.

Threads: the master's own thread sends every invocation of a stage, then waits for all of them at once
(:func:`functions.invoker.policy.as_completed`: their hedges, retries and deadlines on one clock) and
gathers each part as it answers. Its own parts of a stage that also has workers' parts run in one helper
thread beside that wait. A thread per part cost a master at 0.29 vCPU its quota in hand-offs.

A stage assigned wholly to one other function (MOPAR's vertical slice) leaves its outputs in the
transport: the master holds a :class:`RemoteTensor` (a ref plus dtype and shape) and passes the ref on to
the next stage's parts, so the tensor goes worker to worker without passing through the master's
memory. A remote tensor is fetched only where its values are needed here (a join, an epilogue, a part
the master runs, the model outputs) or where a part needs a region of it and the transport cannot read
regions in place (only shared memory can). On shared memory the request's float inputs are remote tensors
from the start (the caller stored them: the first stage's parts read their regions there), and a tensor
the master holds whose regions several parts take (a spatial split of a joined tensor) is stored once,
whole, with each part's event naming its region.

Trace: the master records a span per step of the request (:mod:`functions.trace`): per stage, per part the
scatter of its inputs, its invocation, the worker's read / compute / write (from its reply's timings), the
reply, the gather of its outputs; the join and epilogue. Each span is two ``perf_counter`` stamps in a
list; the reply carries them (``Reply.trace``) and their breakdown (``trace_compute_ms``,
``trace_communication_ms``, ``trace_dispatch_ms``, ``trace_waiting_ms``, summing to ``total_ms``).

Clean-up: the master deletes the tensors it put for a stage once the stage is done, the outputs it
reads as it reads them, remote tensors after their last use, and, at the end of the request, the
outputs of any attempt that lost or failed. TTLs (or the shared-memory sweeper) are the backstop.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from functions.backends import PartSessions
from functions.config import FunctionConfig
from functions.errors import BadRequest, FunctionError, PartError
from functions.event import Event, Reply, TensorEntry
from functions.executor import execute_plan, region_slices
from functions.invoker.policy import CallKey, PolicyCall, PolicyInvoker, as_completed
from functions.plan import Part, Plan, Region, Stage, full_region, region_shape
from functions.procstat import peak_rss_mb
from functions.trace import TraceRecorder, breakdown
from functions.transport.base import TensorKey, scheme_of
from functions.transport.channel import TensorChannel
from functions.transport.factory import TransportSet
from functions.worker import output_key

__all__ = ["CHEAP_PART_BYTES", "Master", "RemoteRegion", "RemoteTensor", "cheap_to_duplicate"]

log = logging.getLogger(__name__)


class RemoteTensor:
    """A stage output that stays in the transport until its values are needed in the master.

    Indexing it with a region's slices (what :func:`functions.executor.part_inputs` does) gives a
    :class:`RemoteRegion` instead of copying anything.
    """

    __slots__ = ("array", "dtype", "live", "name", "ref", "shape")

    def __init__(self, name: str, ref: str, dtype: str, shape: tuple[int, ...]) -> None:
        self.name = name
        self.ref = ref
        self.dtype = np.dtype(dtype)
        self.shape = shape
        self.array: np.ndarray | None = None  # set once fetched
        self.live = True  # the stored copy still exists

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, key: Any) -> RemoteRegion | np.ndarray:
        if self.array is not None:
            return self.array[key]
        if not isinstance(key, tuple):
            key = (key,)
        if len(key) != self.ndim or not all(isinstance(k, slice) for k in key):
            raise TypeError(f"a remote tensor takes one slice per axis, got {key!r}")
        region = []
        for k, d in zip(key, self.shape, strict=True):
            start, stop, step = k.indices(d)
            if step != 1:
                raise TypeError("a remote tensor region must have step 1")
            region.append((start, max(start, stop)))
        return RemoteRegion(self, tuple(region))

    def __repr__(self) -> str:
        return f"RemoteTensor({self.name!r}, {self.ref!r}, {self.dtype}{list(self.shape)})"


@dataclass(frozen=True)
class RemoteRegion:
    tensor: RemoteTensor
    region: Region

    @property
    def whole(self) -> bool:
        return self.region == full_region(self.tensor.shape)


#: a part whose file (its weights, mostly) is larger is not cheap to duplicate: a hedge usually lands on a
#: fresh instance of its function (one request per instance), which loads the part before it runs
CHEAP_PART_BYTES = 16 * 1024 * 1024


def cheap_to_duplicate(stage: Stage, bundle_dir: str | Path, *, max_part_bytes: int = CHEAP_PART_BYTES) -> bool:
    """Whether a straggling part of ``stage`` is worth a second invocation (hedging, where the function's
    ``hedge_percentile`` is set, the default).

    A split stage (two parts or more) of small parts is: a duplicate re-runs one part, a 1/degree share of
    the stage's work, on inputs already stored (the hedge sends the same references), while a straggler
    holds up every other part of the stage. A stage of one part is not: a duplicate costs the whole stage
    again. Nor is a part over ``max_part_bytes`` (the fully connected layers' weights of a channel or
    reduction split, a vertical slice of the model): the instance a hedge starts loads them first, at its
    CPU share, and rarely answers before the straggler.
    """
    if len(stage.parts) < 2:
        return False
    root = Path(bundle_dir)
    for part in stage.parts:
        try:
            size = (root / part.file).stat().st_size
        except OSError:
            return False  # a part this function cannot see (a bundle fetched per function): not judged cheap
        if size > max_part_bytes:
            return False
    return True


class Master:
    """The master role of a function: ``infer`` runs the whole plan for one request.

    Parameters
    ----------
    plan, bundle_dir: the bundle.
    config: this function's configuration (deployment, transport, limits).
    sessions: the instance's session cache, for parts and epilogues the master runs itself.
    transports: the instance's transports.
    caller: invokes the workers under the deadline / retry / hedging policy.
    """

    def __init__(
        self,
        plan: Plan,
        bundle_dir: str | Path,
        config: FunctionConfig,
        sessions: PartSessions,
        transports: TransportSet,
        caller: PolicyInvoker,
    ) -> None:
        self.plan = plan
        self.bundle_dir = Path(bundle_dir)
        self.config = config
        self.function = config.function
        self.sessions = sessions
        self.transports = transports
        self.caller = caller
        self.channel = TensorChannel(
            transports,
            transport=config.transport,
            fallback=config.fallback_transport,
            payload_limit_bytes=config.payload_limit_bytes,
            inline_max_bytes=config.inline_max_bytes,
            compression=config.compression,
            wire=caller.invoker.wire,
        )
        # the master's own parts of a stage that also has workers' parts run here, beside the wait for them
        self._local = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flatpack-local")
        self.final = {t.name for t in plan.model.outputs}
        self.parts: dict[tuple[int, int], Part] = {(st.index, p.index): p for st in plan.stages for p in st.parts}
        self.last_use: dict[str, int] = {}
        for stage in plan.stages:
            for name in stage.inputs:
                self.last_use[name] = stage.index
        self.hedged_stages = frozenset(st.index for st in plan.stages if cheap_to_duplicate(st, bundle_dir))
        # reference schemes a worker may have written outputs with (for cleaning up lost attempts)
        self.output_schemes = sorted(
            {n for n in (config.transport, config.fallback_transport) if n and n != "inline"}
        )

    def infer(self, event: Event, reply_channel: TensorChannel) -> Reply:
        if self.function != self.plan.master:
            raise BadRequest(
                f"function {self.function!r} is not this plan's master ({self.plan.master!r}); "
                f"send inference requests to the master"
            )
        rec = TraceRecorder()
        t0, c0 = rec.t0, time.process_time()
        run = _RequestRun(self, event, rec)
        passed = self._passed_on(event.inputs)
        inputs: dict[str, Any] = reply_channel.receive([e for e in event.inputs if e.name not in passed], delete=True)
        for name, e in passed.items():
            assert e.ref is not None and e.dtype is not None and e.shape is not None
            inputs[name] = run.remote[name] = RemoteTensor(name, e.ref, e.dtype, e.shape)
        rec.add("inputs", None, None, t0, time.perf_counter())
        try:
            outs = execute_plan(self.plan, inputs, run, run.run_epilogue)
            run.joined()
            t_out = time.perf_counter()
            arrays = {name: run.materialize(v, delete=True) for name, v in outs.items()}
            index = {t.name: i for i, t in enumerate(self.plan.model.outputs)}
            entries = reply_channel.send(
                arrays, lambda n: TensorKey(event.deployment, event.request_id, f"out.o{index[n]}")
            )
        finally:
            run.cleanup()
        t_end = time.perf_counter()
        rec.add("outputs", None, None, t_out, t_end)
        timings = dict(run.timings)
        timings["total_ms"] = total_ms = 1e3 * (t_end - t0)
        # the instance's CPU over the request, every thread: what its share stretches (the platform's top-up)
        timings["cpu_ms"] = 1e3 * (time.process_time() - c0)
        timings["start_unix_ms"] = 1e3 * rec.t0_unix
        timings["fetched_bytes"] = float(run.fetched_bytes)
        timings["sent_bytes"] = float(run.sent_bytes)
        timings["invocations"] = float(run.invocations)
        spans = rec.spans()
        for category, ms in breakdown(spans, total_ms).by_category().items():
            timings[f"trace_{category}_ms"] = ms
        return Reply(outputs=tuple(entries), timings=timings, peak_rss_mb=peak_rss_mb(), trace=tuple(spans))

    def _passed_on(self, entries: Sequence[TensorEntry]) -> dict[str, TensorEntry]:
        """The request's inputs the master leaves where the caller stored them: whole float tensors, by
        reference, in a transport parts read regions of in place (shared memory), with the plan's dtype and
        shape. The parts then read their regions straight from the caller's tensor (no copy in the master,
        no store per part); the master deletes it after its last use."""
        specs = {t.name: t for t in self.plan.model.inputs}
        out: dict[str, TensorEntry] = {}
        for e in entries:
            spec = specs.get(e.name)
            if (e.ref is None or e.region is not None or spec is None or e.dtype != spec.dtype
                    or e.shape != tuple(spec.shape) or np.dtype(spec.dtype).kind != "f"):
                continue  # integer inputs stay here: an index out of range is told apart as the client's error
            try:
                if self.transports.transport(scheme_of(e.ref)).zero_copy:
                    out[e.name] = e
            except FunctionError:
                continue  # a scheme this function has no transport for: receiving it says so
        return out

    def close(self) -> None:
        self._local.shutdown(wait=False, cancel_futures=True)
        self.caller.close()


class _RequestRun:
    """One request's state: the PartRunner that :func:`execute_plan` drives."""

    def __init__(self, master: Master, event: Event, trace: TraceRecorder) -> None:
        self.m = master
        self.event = event
        self.trace = trace
        self._join: tuple[int, float] | None = None  # (stage, when its parts were all back): its join runs next
        self.deadline = event.deadline_ms / 1000
        self.remote: dict[str, RemoteTensor] = {}
        self.launched: dict[tuple[int, int], set[int]] = defaultdict(set)
        self.won: set[str] = set()
        self.succeeded: set[tuple[int, int]] = set()
        self.timings: dict[str, float] = {}
        self.fetched_bytes = 0
        self.sent_bytes = 0
        self.invocations = 0
        self._lock = threading.Lock()
        self._puts = itertools.count()
        # per stage with an epilogue, the attempts that lost and had not answered when it settled: the tensors
        # it retires after the epilogue wait for them (run_stage)
        self._losers: dict[int, list[Future[Reply]]] = {}

    # -- execute_plan's hooks ----------------------------------------------------------------------------

    def joined(self) -> None:
        """The join of the last stage whose parts are back is done (execute_plan joins between the hooks)."""
        if self._join is not None:
            stage, since = self._join
            self.trace.add("join", stage, None, since, time.perf_counter())
            self._join = None

    def run_stage(self, stage: Stage, inputs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        self.joined()
        t0, c0 = time.perf_counter(), time.process_time()
        rec = self.trace
        m = self.m
        parts = stage.parts
        keep_remote = len(parts) == 1 and stage.join == "none"
        stage_puts: list[str] = []
        results: list[dict[str, Any]] = [{} for _ in parts]
        calls: dict[PolicyCall, tuple[int, list[float]]] = {}
        settled = False
        try:
            cache: dict[tuple[str, Region], TensorEntry] = {}
            events: dict[int, list[TensorEntry]] = {}
            for i, part in enumerate(parts):
                if part.function != m.function:
                    ts = time.perf_counter()
                    events[i] = self._entries(stage, part, inputs[i], cache, stage_puts)
                    rec.add("scatter", stage.index, part.index, ts, time.perf_counter())
            local: Future[None] | None = None
            try:
                # every worker's invocation is on the wire before the master computes its own part: sent
                # from this thread, one after another (a thread per send costs a 0.29-vCPU master its quota
                # in hand-offs, and its local part would hold the CPU the sends wait for)
                for i, entries in events.items():
                    call, sent = self._start_call(stage, parts[i], entries)
                    calls[call] = (i, sent)
                mine = [i for i in range(len(parts)) if i not in events]
                if mine and calls:
                    # the master's own parts run beside the wait, so that a crashed or straggling worker is
                    # retried or hedged while they compute
                    local = m._local.submit(self._run_locals, stage, parts, inputs, mine, results)
                elif mine:
                    self._run_locals(stage, parts, inputs, mine, results)
                # one thread waits for all of the stage's calls, and gathers each part as it answers
                for call in as_completed(calls):
                    i, sent = calls[call]
                    results[i] = self._finish_call(stage, parts[i], call.reply(), sent, keep_remote)
                if local is not None:
                    local.result()
                settled = True
            except BaseException:
                for call in calls:
                    call.abandon()
                if local is not None:
                    local.cancel()
                for res in results:
                    self._discard_results(res)
                raise
        finally:
            # what this stage's parts read: its puts, and the tensors no later stage reads (after the epilogue
            # where there is one: it may read them too, a residual, say). Where the stage settled, an attempt
            # that lost (a hedge, a late retry) may still be reading them; deleted under it, it would fail, and
            # the platform count an error for a request that succeeded. So they go once the last such attempt
            # has answered. A stage that failed deletes them now: the request has failed, and what it left
            # must not wait.
            late = [f for call in calls for f in call.outstanding()] if settled else []
            if stage.epilogue is not None and late:
                self._losers[stage.index] = late
            self._delete_once_answered(late, [*stage_puts, *(self._retire(stage.index) if stage.epilogue is None
                                                               else [])])
        for res in results:
            for name, v in res.items():
                if isinstance(v, RemoteTensor):
                    self.remote[name] = v
        t_end = time.perf_counter()
        rec.add("stage", stage.index, None, t0, t_end)
        self._join = (stage.index, t_end)
        self.timings[f"stage{stage.index}_ms"] = 1e3 * (t_end - t0)
        # the instance's CPU in the stage, every thread: what its share makes it wait for (the platform's top-up)
        self.timings[f"stage{stage.index}_cpu_ms"] = 1e3 * (time.process_time() - c0)
        return results

    def run_epilogue(self, stage: Stage, env: Mapping[str, Any]) -> dict[str, np.ndarray]:
        assert stage.epilogue is not None
        self.joined()
        path = self.m.bundle_dir / stage.epilogue
        names = self.m.sessions.input_names(path)
        ts = time.perf_counter()
        try:
            out = self.m.sessions.run(path, {n: self.materialize(env[n]) for n in names})
            self.trace.add("epilogue", stage.index, None, ts, time.perf_counter())
            self._delete_once_answered(self._losers.pop(stage.index, []), self._retire(stage.index))
            return out
        except KeyError as e:
            raise PartError(f"epilogue {stage.epilogue} needs tensor {e}, which no stage produced") from e
        except Exception as e:
            if isinstance(e, FunctionError):
                raise
            raise PartError(f"epilogue {stage.epilogue} failed: {e}", function=self.m.function) from e

    # -- helpers -----------------------------------------------------------------------------------------

    def materialize(self, value: Any, *, delete: bool = False) -> np.ndarray:
        if isinstance(value, RemoteRegion):
            return self.materialize(value.tensor)[region_slices(value.region)]
        if isinstance(value, RemoteTensor):
            if value.array is None:
                value.array = self.m.transports.get(value.ref, delete=delete and value.live)
                self.fetched_bytes += value.array.nbytes
                if delete:
                    value.live = False
            elif delete and value.live:
                self._delete([value.ref])
                value.live = False
            return value.array
        return np.asarray(value)

    def _entries(
        self,
        stage: Stage,
        part: Part,
        inputs: Mapping[str, Any],
        cache: dict[tuple[str, Region], TensorEntry],
        stage_puts: list[str],
    ) -> list[TensorEntry]:
        """The event inputs of one part: refs passed on where possible, the rest sent through the channel.

        A tensor region several parts need (a channel split's whole input) is stored once per stage. Where
        the transport reads regions in place (shared memory), a tensor the parts take regions of (a spatial
        split's tiles with their halos) is stored once, whole, and each part gets the reference and its
        region: one contiguous write in the master instead of a strided copy and a write per part (the master
        does this at its CPU share for every part; each worker cuts its own region, all at once).
        """
        m = self.m
        region_of = {pi.name: pi.region for pi in part.inputs}
        entries: list[TensorEntry] = []
        to_send: dict[str, np.ndarray] = {}
        for name, value in inputs.items():
            ck = (name, region_of[name])
            hit = cache.get(ck)
            if hit is not None:
                entries.append(hit)
                continue
            if self._regions_in_place and isinstance(value, np.ndarray):
                whole = _whole_of(value, region_of[name])
                if whole is not None and whole.nbytes > m.channel.inline_max_bytes:
                    e = self._put_whole(stage, name, whole, cache, stage_puts)
                    if region_of[name] != full_region(whole.shape):
                        e = TensorEntry(name, ref=e.ref, region=region_of[name], dtype=e.dtype, shape=e.shape)
                    cache[ck] = e
                    entries.append(e)
                    continue
            if isinstance(value, RemoteRegion) and value.tensor.array is None:
                rt = value.tensor
                if value.whole or m.transports.transport(scheme_of(rt.ref)).zero_copy:
                    e = TensorEntry(
                        name, ref=rt.ref, region=None if value.whole else value.region,
                        dtype=rt.dtype.name, shape=rt.shape,
                    )
                    cache[ck] = e
                    entries.append(e)
                    continue
            to_send[name] = self.materialize(value)
        if to_send:
            n = next(self._puts)
            sent = m.channel.send(
                to_send,
                lambda name: TensorKey(
                    self.event.deployment, self.event.request_id, f"s{stage.index}.i{n}.{_idx(part, name)}"
                ),
                reserved_bytes=m.channel.inline_bytes(entries),
            )
            for e in sent:
                cache[(e.name, region_of[e.name])] = e
                if e.ref is not None:
                    stage_puts.append(e.ref)
                self.sent_bytes += int(np.asarray(to_send[e.name]).nbytes)
            entries += sent
        return entries

    @property
    def _regions_in_place(self) -> bool:
        """Whether the channel stores tensors where a part can read a region of them without a copy."""
        m = self.m
        ch = m.channel
        return ch.transport != "inline" and m.transports.transport(ch.transport).zero_copy

    def _put_whole(self, stage: Stage, name: str, whole: np.ndarray, cache: dict[tuple[str, Region], TensorEntry],
                   stage_puts: list[str]) -> TensorEntry:
        """``whole`` stored once per stage (the entry for all of it, cached under its full region)."""
        ck = (name, full_region(whole.shape))
        hit = cache.get(ck)
        if hit is not None and hit.ref is not None:
            return hit
        n = next(self._puts)
        e = self.m.channel.send_by_ref(
            name, whole, TensorKey(self.event.deployment, self.event.request_id, f"s{stage.index}.w{n}"))
        assert e.ref is not None
        stage_puts.append(e.ref)
        self.sent_bytes += int(whole.nbytes)
        cache[ck] = e
        return e

    def _start_call(self, stage: Stage, part: Part, entries: list[TensorEntry]) -> tuple[PolicyCall, list[float]]:
        """Send one part's first attempt; the call (with retries / hedging to come) and when each of its
        attempts was sent."""
        m = self.m
        ev = self.event
        wire = m.caller.invoker.wire
        launched = self.launched[(stage.index, part.index)]
        sent: list[float] = []  # when each attempt was sent

        def payload_for(attempt: int) -> bytes:
            launched.add(attempt)
            sent.append(time.perf_counter())
            with self._lock:
                self.invocations += 1
            return Event(
                "part", ev.request_id, ev.deployment, ev.deadline_ms, tuple(entries),
                stage=stage.index, part=part.index, attempt=attempt,
            ).encode(wire)

        def failed(attempt: int, err: FunctionError) -> None:
            # why attempts failed, by the error's kind: a killed instance shows as the platform's report
            # (InstanceCrashed), not as a timeout; the trace shows the time each failed attempt took
            now = time.perf_counter()
            name = f"attempts_failed_{err.type}"
            with self._lock:
                self.timings[name] = self.timings.get(name, 0.0) + 1
            if attempt < len(sent):
                self.trace.add("failed", stage.index, part.index, sent[attempt], now)

        call = m.caller.start(
            m.config.invoke_name(part.function),
            payload_for,
            deadline=self.deadline,
            key=CallKey(part.function, stage.index, part.index),
            discard=self._discard_reply,
            lost=lambda attempt: self._discard_attempt(stage.index, part.index, attempt),
            failed=failed,
            hedge=stage.index in m.hedged_stages,
        )
        return call, sent

    def _finish_call(self, stage: Stage, part: Part, reply: Reply, sent: list[float],
                     keep_remote: bool) -> dict[str, Any]:
        """One part's outputs from its successful reply: arrays, or remote tensors."""
        m = self.m
        received = time.perf_counter()
        self._trace_call(stage.index, part.index, sent, received, reply.timings)
        refs = [e.ref for e in reply.outputs if e.ref is not None]
        with self._lock:
            self.won.update(refs)
            # the workers' own figures, summed per stage: reading their inputs, running, writing their outputs
            for k in ("read_ms", "run_ms", "write_ms"):
                if k in reply.timings:
                    name = f"stage{stage.index}_workers_{k}"
                    self.timings[name] = self.timings.get(name, 0.0) + float(reply.timings[k])
        missing = set(part.outputs) - {e.name for e in reply.outputs}
        if missing:
            self._delete(refs)
            raise PartError(f"stage {stage.index} part {part.index} replied without outputs {sorted(missing)}",
                            function=part.function)
        if keep_remote:
            with self._lock:
                self.succeeded.add((stage.index, part.index))
            out: dict[str, Any] = {}
            inline = [e for e in reply.outputs if e.ref is None]
            out.update(m.channel.receive(inline))
            for e in reply.outputs:
                if e.ref is not None:
                    if e.dtype is None or e.shape is None:
                        out[e.name] = m.transports.get(e.ref, delete=True)
                    else:
                        out[e.name] = RemoteTensor(e.name, e.ref, e.dtype, e.shape)
            self.trace.add("gather", stage.index, part.index, received, time.perf_counter())
            return out
        arrays = m.channel.receive(reply.outputs, delete=True)
        self.trace.add("gather", stage.index, part.index, received, time.perf_counter())
        by_ref = {e.name for e in reply.outputs if e.ref is not None}
        with self._lock:
            self.fetched_bytes += sum(a.nbytes for n, a in arrays.items() if n in by_ref)
            self.succeeded.add((stage.index, part.index))
        return arrays

    def _trace_call(self, stage: int, part: int, sent: Sequence[float], received: float,
                    timings: Mapping[str, float]) -> None:
        """The spans of the attempt that answered: the last one sent before the worker started (a hedge
        that lost was sent earlier or later; a retry's failed attempts before it leave a gap: waiting)."""
        rec = self.trace
        started = timings.get("start_unix_ms")
        at = sent[0] if sent else received
        if started is not None:
            start = rec.unix_to_perf(started / 1e3)
            at = max((t for t in sent if t <= start), default=at)
        rec.worker(stage, part, at, received, timings)

    def _run_locals(self, stage: Stage, parts: Sequence[Part], inputs: Sequence[Mapping[str, Any]],
                    indices: Sequence[int], results: list[dict[str, Any]]) -> None:
        """Run the stage's parts ``indices`` in this process, into ``results``."""
        for i in indices:
            ts = time.perf_counter()
            results[i] = self._run_local(parts[i], inputs[i])
            self.trace.add("compute", stage.index, parts[i].index, ts, time.perf_counter())

    def _run_local(self, part: Part, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        arrays = {name: self.materialize(v) for name, v in inputs.items()}
        try:
            outs = self.m.sessions.run(self.m.bundle_dir / part.file, arrays)
        except Exception as e:
            if isinstance(e, FunctionError):
                raise
            raise PartError(f"part {part.file} failed in the master: {e}", function=self.m.function) from e
        return {name: outs[name] for name in part.outputs}

    def _retire(self, stage_index: int) -> list[str]:
        """Forget the remote tensors no later stage reads; their references, for the caller to delete."""
        refs = []
        for name, rt in list(self.remote.items()):
            if self.m.last_use.get(name, -1) <= stage_index and name not in self.m.final:
                if rt.live:
                    refs.append(rt.ref)
                    rt.live = False
                del self.remote[name]
        return refs

    def _delete_once_answered(self, attempts: Sequence[Future[Reply]], refs: Sequence[str]) -> None:
        """Delete ``refs`` once every one of ``attempts`` has answered (from the thread that reads the last;
        now, where there are none)."""
        if not attempts or not refs:
            self._delete(refs)
            return
        left = [len(attempts)]
        lock = threading.Lock()

        def answered(_: Future[Reply]) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                self._delete(refs)

        for f in attempts:
            f.add_done_callback(answered)

    def _delete(self, refs: Sequence[str]) -> None:
        if not refs:
            return
        try:
            self.m.transports.delete(refs)
        except FunctionError as e:
            log.warning("could not delete %d tensor(s) of request %s: %s", len(refs), self.event.request_id, e)

    def _discard_reply(self, reply: Reply) -> None:
        self._delete([e.ref for e in reply.outputs if e.ref is not None])

    def _attempt_refs(self, stage: int, part: int, attempt: int) -> list[str]:
        """Every reference one attempt of a part may have stored its outputs under (a worker writes with
        the deployment's transport, or its fallback), less those a winning reply handed over."""
        ev = self.event
        refs = []
        for i in range(len(self.m.parts[(stage, part)].outputs)):
            key = output_key(ev.deployment, ev.request_id, stage, part, attempt, i)
            refs += [r for r in (f"{scheme}:{key}" for scheme in self.m.output_schemes) if r not in self.won]
        return refs

    def _discard_attempt(self, stage: int, part: int, attempt: int) -> None:
        """A lost attempt ended in an error after its part was settled (a hedge or late retry whose instance
        was killed): what it stored before it died is deleted, since no reply names it and the request's
        clean-up may have run before it was written."""
        self._delete(self._attempt_refs(stage, part, attempt))

    def _discard_results(self, results: Mapping[str, Any]) -> None:
        """Delete the remote tensors among a part's gathered outputs (its stage failed)."""
        for v in results.values():
            if isinstance(v, RemoteTensor) and v.live:
                self._delete([v.ref])
                v.live = False

    def cleanup(self) -> None:
        """Delete what this request left in the transports: live remote tensors, lost attempts' outputs."""
        refs = [rt.ref for rt in self.remote.values() if rt.live]
        for rt in self.remote.values():
            rt.live = False
        self.remote.clear()
        for (s, p), attempts in self.launched.items():
            if len(attempts) == 1 and (s, p) in self.succeeded:
                continue  # the usual case: one attempt, whose outputs are handled already
            for a in attempts:
                refs += self._attempt_refs(s, p, a)
        self._delete(refs)


def _whole_of(view: np.ndarray, region: Region) -> np.ndarray | None:
    """The array ``view`` was cut from as ``whole[region]`` (what :func:`functions.executor.part_inputs`
    does), or None where that cannot be told for sure: the candidate (``view.base``) must have the view's
    dtype, rank and strides, hold the region, and start the region where the view starts in memory."""
    base = view.base
    if not isinstance(base, np.ndarray) or base.dtype != view.dtype or base.ndim != view.ndim:
        return None
    if len(region) != base.ndim or any(b > d for (_, b), d in zip(region, base.shape, strict=True)):
        return None
    if view.strides != base.strides or view.shape != region_shape(region) or not base.flags.c_contiguous:
        return None
    offset = sum(a * st for (a, _), st in zip(region, base.strides, strict=True))
    if view.__array_interface__["data"][0] != base.__array_interface__["data"][0] + offset:
        return None
    return base


def _idx(part: Part, name: str) -> int:
    for i, pi in enumerate(part.inputs):
        if pi.name == name:
            return i
    raise BadRequest(f"part {part.file} has no input {name!r}")

"""The worker: runs one part of one stage per event.

An instance loads the sessions of its function's parts once (its cold start) and keeps them. For each
event it reads the part's inputs (inline, or by reference, taking only the region it needs), runs the
part with onnxruntime, and sends the outputs back inline or through the transport under keys that name
the request, stage, part and attempt, so retried and hedged attempts never overwrite each other.
Inputs it reads by reference are *not* deleted: a retry may need them; the master deletes them once
the stage is done.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from functions.backends import PartSessions
from functions.errors import BadRequest, FunctionError, InvokeTimeout, PartError
from functions.event import Event, Reply, now_ms
from functions.plan import Part, Plan, Stage
from functions.procstat import peak_rss_mb
from functions.settings import cpu_share
from functions.transport.base import TensorKey
from functions.transport.channel import TensorChannel

__all__ = ["Worker", "output_key"]

log = logging.getLogger(__name__)


def output_key(deployment: str, request_id: str, stage: int, part: int, attempt: int, index: int) -> TensorKey:
    """Key of output ``index`` of one attempt at one part (the master also uses it to clean up after
    attempts that lost or failed)."""
    return TensorKey(deployment, request_id, f"s{stage}p{part}a{attempt}.o{index}")


class Worker:
    """Runs the parts of ``plan`` that are assigned to ``function``.

    Parameters
    ----------
    plan, bundle_dir: the bundle.
    function: this function's name in the plan.
    sessions: the instance's session cache (shared with the master role, if this function has it).
    """

    def __init__(self, plan: Plan, bundle_dir: str | Path, function: str, sessions: PartSessions) -> None:
        self.plan = plan
        self.bundle_dir = Path(bundle_dir)
        self.function = function
        self.sessions = sessions
        self._parts: dict[tuple[int, int], tuple[Stage, Part]] = {
            (s.index, p.index): (s, p) for s in plan.stages for p in s.parts
        }
        # the share of a core the local platform holds this instance to (None elsewhere): after a part it
        # waits until the part's wall time is its CPU over the share (functions.local_instance), which the
        # master's trace shows as the part's compute rather than as its reply
        self._share = cpu_share()

    def preload(self) -> int:
        """Create the sessions of every part this function runs, and run each once on zeros (the instance's
        cold start pays the first run, not its first request); returns how many."""
        n = 0
        for _, part in self._parts.values():
            if part.function == self.function:
                self.sessions.warm_up(self.bundle_dir / part.file)
                n += 1
        return n

    def part(self, stage: int, part: int) -> tuple[Stage, Part]:
        try:
            return self._parts[(stage, part)]
        except KeyError:
            raise BadRequest(f"the plan has no stage {stage} part {part}") from None

    def run(self, event: Event, channel: TensorChannel) -> Reply:
        t0, c0 = time.perf_counter(), time.process_time()
        started_unix_ms = 1e3 * time.time()  # where the master's trace places this part's steps
        assert event.stage is not None and event.part is not None
        stage, part = self.part(event.stage, event.part)
        if part.function != self.function:
            raise BadRequest(
                f"stage {stage.index} part {part.index} runs on function {part.function!r}, "
                f"but was sent to {self.function!r}"
            )
        if now_ms() > event.deadline_ms:
            raise InvokeTimeout(f"stage {stage.index} part {part.index}: the deadline passed before it started")
        inputs = channel.receive(event.inputs, delete=False)
        t1 = time.perf_counter()
        try:
            outs = self.sessions.run(self.bundle_dir / part.file, inputs)
        except FunctionError:
            raise
        except KeyError as e:
            raise PartError(f"part {part.file} needs input {e}, which the event did not carry") from e
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own untyped errors
            raise PartError(f"part {part.file} failed: {e}") from e
        del inputs  # drop mapped inputs before the outputs are written
        t2 = time.perf_counter()
        if now_ms() > event.deadline_ms:
            raise InvokeTimeout(f"stage {stage.index} part {part.index}: finished after the deadline")
        index = {name: i for i, name in enumerate(part.outputs)}
        try:
            wanted = {name: outs[name] for name in part.outputs}
        except KeyError as e:
            raise PartError(f"part {part.file} produced no output {e}") from e
        entries = channel.send(
            wanted,
            lambda name: output_key(
                event.deployment, event.request_id, stage.index, part.index, event.attempt, index[name]
            ),
        )
        t3 = time.perf_counter()
        timings = {"read_ms": 1e3 * (t1 - t0), "run_ms": 1e3 * (t2 - t1), "write_ms": 1e3 * (t3 - t2),
                   "start_unix_ms": started_unix_ms}
        if self._share is not None:
            timings["share_ms"] = max(0.0, 1e3 * ((time.process_time() - c0) / self._share - (t3 - t0)))
        return Reply(
            outputs=tuple(entries),
            timings=timings,
            peak_rss_mb=peak_rss_mb(),
        )

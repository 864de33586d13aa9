"""A stage choice (units, split, placement, memory, codecs) and the model's figures for it: its option cost, and
the lower bounds the exact solver prunes with.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from functions.plan import Split
from partitioner.parts import PartCost
from partitioner.tail import (
    StageShape,
)

__all__ = ["NO_RELAY", "CutCodec", "CutCodecs", "OptionCost", "OptionFloors", "Relay", "StageChoice"]

@dataclass(frozen=True)
class CutCodec:
    """A lossy codec baked into the two parts around a cut (MOPAR's split-point autoencoder): the part
    before the cut after unit ``after`` encodes ``tensor`` (``bytes_before``) into ``bytes_after`` bytes in
    ``encode_ms``, the part after it decodes them in ``decode_ms`` (both one thread at one vCPU, measured).
    ``accuracy_drop``: what it costs the model's top-1 accuracy (a fraction, measured on labelled held-out
    data); ``label``: how plans show it (``ae:4``)."""

    after: int
    tensor: str
    bytes_before: int
    bytes_after: int
    encode_ms: float
    decode_ms: float
    accuracy_drop: float
    label: str

    @property
    def saved_bytes(self) -> int:
        return self.bytes_before - self.bytes_after


#: What a planner may ask about the cut after a unit: the codecs it may place there (none: empty).
CutCodecs = Callable[[int], Sequence[CutCodec]]


@dataclass(frozen=True)
class StageChoice:
    """One stage of a candidate plan: units, split, whether the master runs part 0, worker memory; and the
    codecs its one part runs at its edges: ``decode`` the cut before it, ``encode`` the cut after it (an
    unsplit stage only: the codec works on the whole tensor)."""

    first: int
    last: int
    split: Split
    master_part: bool = True
    worker_mb: int = 0  # 0: the same memory as the master
    decode: CutCodec | None = None
    encode: CutCodec | None = None

    def __str__(self) -> str:
        place = "m+w" if self.master_part else "w"
        codecs = "".join(f"{s}{c.label}" for s, c in (("<", self.decode), (">", self.encode)) if c is not None)
        return (f"{self.first}-{self.last}:{self.split}[{place}{'@' + str(self.worker_mb) if self.worker_mb else ''}]"
                f"{codecs}")

    @property
    def plain(self) -> StageChoice:
        """This choice without its codecs."""
        return self if self.decode is None and self.encode is None else replace(self, decode=None, encode=None)

    @property
    def codec_ms(self) -> float:
        """The compute its codecs add, one thread at one vCPU."""
        return ((self.decode.decode_ms if self.decode is not None else 0.0)
                + (self.encode.encode_ms if self.encode is not None else 0.0))

    def coded(self, cost: PartCost) -> PartCost:
        """``cost`` (the stage's one part) with the bytes its codecs save off its input and output."""
        return replace(cost, input_bytes=cost.input_bytes - (self.decode.saved_bytes if self.decode else 0),
                       output_bytes=cost.output_bytes - (self.encode.saved_bytes if self.encode else 0))


@dataclass(frozen=True)
class Relay:
    """How a stage's edge tensors skip the master (``functions.master``): a stage of one worker part that
    joins nothing leaves its outputs in the transport, and a next stage that only workers run reads them by
    reference. ``arrives``: the bytes of this stage's input that reach its workers so (no put of them);
    ``stays``: its outputs stay for the next stage's workers (the master neither reads nor joins them)."""

    arrives: int = 0
    stays: bool = False


NO_RELAY = Relay()


@dataclass(frozen=True)
class OptionCost:
    """The model's figures for one stage choice at a given master memory."""

    latency_ms: float
    latency_q_ms: float
    worker_gb_ms: float  # sum over workers of GB x billed ms
    invocations: int
    master_weights_mb: float  # weights the master holds for its part
    master_hold_mb: float  # the master's peak working set for this stage beyond its weights
    worker_need_mb: float  # the largest worker part's memory need
    payload_bytes: int  # largest single tensor passed to or from a worker
    # what the master's stage timing covers: from the stage's first send until every part's result is in and
    # read (functions.master reads each part's outputs as it answers); the latency less joining them
    stage_ms: float = 0.0
    measured: bool = False  # stage_ms is a live measurement (partitioner.stage_times), not the model's
    shape: StageShape | None = None  # what its latency distribution is made of (partitioner.tail)
    master_cpu_ms: float = 0.0  # the master's CPU for this stage at a whole core (its part and its handling)


def _corrected(oc: OptionCost, factor: float) -> OptionCost:
    """``oc`` with its stage latency (mean and percentile by the same shift) and its master's CPU scaled by a
    live ``factor`` (:mod:`partitioner.live`)."""
    if factor == 1.0:
        return oc
    shift = (factor - 1.0) * oc.latency_ms
    shape = replace(oc.shape, shift_ms=oc.shape.shift_ms + shift) if oc.shape is not None else None
    return replace(oc, latency_ms=oc.latency_ms + shift, latency_q_ms=oc.latency_q_ms + shift,
                   stage_ms=max(0.0, oc.stage_ms + shift), master_cpu_ms=oc.master_cpu_ms * factor, shape=shape)


@dataclass(frozen=True)
class OptionFloors:
    """Lower bounds on the figures :meth:`PerfModel.option` gives the choices of one stage that differ only in
    their workers' memory, with each of several master memories (:meth:`PerfModel.option_floors`), and those
    of their figures that depend on neither memory. The latencies are kept as the terms they are made of, one
    per worker memory or one per master memory, not as a table of every pair."""

    invocations: int
    master_weights_mb: float
    master_hold_mb: float
    worker_need_mb: float
    worker_gb_ms: np.ndarray  # per worker memory: at most the workers' GB x billed ms, with any master
    # _option's terms at their least. Per worker memory: the workers' path (the last one's invoke and the
    # slowest's time) and its percentile (None: not bounded); per master memory: the master's dispatching and
    # own part, its CPU floor. Measured stage times: the factor they put on each latency where they scale it
    # (None: none), and the (worker memory, master memory) pairs they price, bounded by nothing
    workers_ms: np.ndarray
    workers_q_ms: np.ndarray | None
    busy_ms: np.ndarray
    floor_ms: np.ndarray
    put_ms: float
    get_ms: float
    join_ms: float
    scale: float | None = None
    measured: tuple[tuple[int, int], ...] = ()

    def latency_ms(self, k: int | None = None) -> np.ndarray:
        """At most the mean latency per worker memory with master ``k`` (an index into the master memories
        asked for); without ``k``, per worker memory and master memory."""
        workers, busy, floor = self._terms(self.workers_ms, k)
        out = np.maximum(self.put_ms + np.maximum(busy, workers) + self.get_ms + self.join_ms, floor)
        return self._measured(out if self.scale is None else out * self.scale, k, 0.0)

    def latency_q_ms(self, k: int | None = None) -> np.ndarray | None:
        """As :meth:`latency_ms` for the percentile's latency (without the master's own part), or None where it
        is not bounded."""
        if self.workers_q_ms is None:
            return None
        workers, _, floor = self._terms(self.workers_q_ms, k)
        return self._measured(np.maximum(self.put_ms + workers + (self.get_ms + self.join_ms), floor), k, -np.inf)

    def select(self, rows: Sequence[int]) -> OptionFloors:
        """The bounds of the worker memories at ``rows`` only."""
        at = {r: i for i, r in enumerate(rows)}
        return replace(self, worker_gb_ms=self.worker_gb_ms[rows], workers_ms=self.workers_ms[rows],
                       workers_q_ms=self.workers_q_ms[rows] if self.workers_q_ms is not None else None,
                       measured=tuple((at[r], c) for r, c in self.measured if r in at))

    def _terms(self, workers: np.ndarray, k: int | None) -> tuple[np.ndarray, Any, Any]:
        if k is not None:
            return workers, self.busy_ms[k], self.floor_ms[k]
        return workers[:, None], self.busy_ms[None, :], self.floor_ms[None, :]

    def _measured(self, latency: np.ndarray, k: int | None, least: float) -> np.ndarray:
        for r, c in self.measured:
            if k is None:
                latency[r, c] = least
            elif c == k:
                latency[r] = least
        return latency


@dataclass(frozen=True)
class _StageParts:
    """What a stage choice's figures take from its parts alone, whatever its functions' memories: the
    solvers price every choice with every master and worker memory, and these figures once per choice."""

    mine: PartCost | None  # the master's part
    theirs: tuple[PartCost, ...]  # the workers' parts
    codec_ms: float
    transfers: tuple[float, ...]  # per worker part: moving its input and its output
    put: float
    get: float
    join: float
    expected_max: float  # of the workers' invoke latencies
    sigma: float
    master_weights_mb: float
    master_hold_mb: float
    worker_need_mb: float
    payload_bytes: int
    # the share of the model's reread weights the master's part and the largest worker's hold
    # (PerfModel.reread_share): how much of the model's own CPU-share slow-down their compute takes
    mine_reread: float = 1.0
    theirs_reread: float = 1.0


@dataclass(slots=True)
class _Workers:
    """A stage choice's workers at one memory, with no other function contending for the host's cores."""

    fixed: tuple[float, ...]
    compute: tuple[float, ...]
    slowest: float  # the slowest worker's time (0 without workers)
    billed_ms: float  # their billed durations, summed
    worst_q: float | None = None  # the slowest at the model's percentile (tail.workers_quantile), once asked

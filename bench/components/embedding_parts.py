"""An embedding split's parts timed against the whole lookup stage (``flatpack bench embedding``).

The stage that holds a model's embedding lookups (the DLRM's tables) is cut whole and into ``embedding=N``
parts (:mod:`partitioner.embedding`), each saved with its tables as external data and run by onnxruntime
in this process at one thread, as a function of one vCPU runs it. Every round draws fresh indices (a
request looks up rows anywhere in its tables, not the rows the last one left in cache) and runs the whole
stage and every part on them in turn, so that the machine's drift hits all alike. Reported per part: its
median, its ratio to the whole stage's median in the same rounds, and the ratio the performance model
prices it at (the part's FLOPs over the stage's, :func:`partitioner.embedding.embedding_costs`).
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["EmbeddingPartsResult", "PartRow", "lookup_unit", "measure"]


@dataclass(frozen=True)
class PartRow:
    degree: int
    part: int
    p50_ms: float
    ratio: float  # the part's median over the whole stage's
    modelled_ratio: float  # the part's FLOPs over the stage's, as the performance model prices it

    @property
    def error(self) -> float:
        return self.modelled_ratio / self.ratio - 1.0 if self.ratio > 0 else float("inf")


@dataclass(frozen=True)
class EmbeddingPartsResult:
    model: str
    unit: int
    whole_p50_ms: float
    rounds: int
    rows: list[PartRow]
    machine: dict[str, Any] = field(default_factory=dict)

    @property
    def worst_error(self) -> float:
        return max((abs(r.error) for r in self.rows), default=0.0)

    def to_json(self) -> dict[str, Any]:
        return {"page": "embedding", "model": self.model, "unit": self.unit, "whole_p50_ms": self.whole_p50_ms,
                "rounds": self.rounds, "worst_error": self.worst_error,
                "rows": [asdict(r) | {"error": r.error} for r in self.rows], "machine": self.machine}


def lookup_unit(lg: Any) -> int:
    """The first unit an embedding split can cut (ValueError where none can)."""
    from partitioner.errors import NotSplittable
    from partitioner.parts import CutStage

    for u in range(len(lg.units)):
        try:
            CutStage(lg, u, u).embedding()
        except NotSplittable:
            continue
        return u
    raise ValueError(f"{lg.name}: no unit holds embedding lookups an embedding split can cut")


def _session(model: Any, path: Path) -> Any:
    import onnx

    from functions.session import make_session

    onnx.save(model, path, save_as_external_data=True, location=path.name + ".data")
    return make_session(path, intra_op_threads=1)


def _shape(arg: Any) -> list[int]:
    """A session input's shape, a symbolic dimension (a batch) taken as 1."""
    return [d if isinstance(d, int) else 1 for d in arg.shape]


def _feeds(sessions: Sequence[Any], rng: np.random.Generator, indices: Callable[[int], np.ndarray]
           ) -> dict[str, np.ndarray]:
    """One round's inputs for every session: ``indices(n)`` for an index input of n elements, floats
    elsewhere."""
    feeds: dict[str, np.ndarray] = {}
    for s in sessions:
        for i in s.get_inputs():
            if i.name in feeds:
                continue
            shape = _shape(i)
            feeds[i.name] = (indices(math.prod(shape)).reshape(shape) if "int" in i.type else
                             rng.random(shape, dtype=np.float32))
    return feeds


def _sweeps(rows: int, row_bytes: int, per_input: int) -> list[Callable[[int], np.ndarray]]:
    """Rounds of indices that look up one row of every page of the tables (``rows`` rows of ``row_bytes``),
    ``per_input`` a round: onnxruntime maps a model's external data from its file, and a page is mapped on
    its first lookup, so a timing of a few dozen random rounds would be mostly the first lookups of pages
    (the more rows a session holds, the more of them), where a function that has served for a while has
    every page mapped."""
    stride = max(1, 4096 // max(1, row_bytes))
    touch = np.arange(0, rows, stride, dtype=np.int64)
    return [functools.partial(np.resize, touch[k:k + per_input]) for k in range(0, len(touch), per_input)]


def measure(lg: Any, *, degrees: Sequence[int] = (2, 4), rounds: int = 40, warmup: int = 5, seed: int = 0,
            progress: Callable[[str], None] | None = None) -> EmbeddingPartsResult:
    """Time the lookup stage of ``lg`` whole and cut into each of ``degrees`` parts (see the module)."""
    from bench.harness.provenance import machine
    from partitioner.parts import CutStage
    from partitioner.spec import parse_split

    say = progress or (lambda _m: None)
    unit = lookup_unit(lg)
    stage = CutStage(lg, unit, unit)
    tables = [lg.tensors[lg.nodes[ni].input[0]] for ni in stage.embedding().lookups]
    rows = min(t.shape[0] for t in tables)
    row_bytes = min(t.nbytes // max(1, t.shape[0]) for t in tables)
    whole_flops = stage.whole_cost().flops
    with tempfile.TemporaryDirectory(prefix="flatpack-bench-embedding-") as tmp:
        say(f"unit {unit}: cutting it whole and into {', '.join(map(str, degrees))} parts")
        whole = stage.cut(parse_split("none", None)).whole
        names = ["whole"]
        sessions = [_session(whole, Path(tmp) / "whole.onnx")]
        modelled: dict[str, tuple[int, int, float]] = {}
        for k in degrees:
            split = parse_split("embedding", str(k))
            costs = stage.costs(split)
            for j, part in enumerate(stage.cut(split).parts):
                name = f"e{k}p{j}"
                names.append(name)
                sessions.append(_session(part.model, Path(tmp) / f"{name}.onnx"))
                modelled[name] = (k, j, costs[j].flops / whole_flops if whole_flops else 1.0)
        # the files just written (gigabytes of tables) are flushed before the rounds, not written back
        # during them
        os.sync()
        rng = np.random.default_rng(seed)
        per_input = max((math.prod(_shape(i)) for s in sessions for i in s.get_inputs() if "int" in i.type),
                        default=1)
        sweeps = _sweeps(rows, row_bytes, per_input)
        times: dict[str, list[float]] = {n: [] for n in names}
        say(f"{len(sweeps)} rounds mapping every page of the tables, {warmup} warm-up and {rounds} timed rounds, "
            "one thread")
        for sweep in sweeps:
            feeds = _feeds(sessions, rng, sweep)
            for s in sessions:
                s.run(None, {i.name: feeds[i.name] for i in s.get_inputs()})
        for r in range(warmup + rounds):
            feeds = _feeds(sessions, rng, lambda n: rng.integers(0, rows, n, dtype=np.int64))
            for name, s in zip(names, sessions, strict=True):
                mine = {i.name: feeds[i.name] for i in s.get_inputs()}
                t0 = time.perf_counter()
                s.run(None, mine)
                if r >= warmup:
                    times[name].append((time.perf_counter() - t0) * 1e3)
    medians = {n: statistics.median(ts) for n, ts in times.items()}
    whole_ms = medians["whole"]
    out = [PartRow(k, j, medians[n], medians[n] / whole_ms, m) for n, (k, j, m) in modelled.items()]
    return EmbeddingPartsResult(lg.name, unit, whole_ms, rounds, out, machine())

"""The suite (``flatpack bench suite``): the papers' comparisons, each a ratio measured in one run.

Comparisons (ratio > 1: the candidate is better, i.e. faster or cheaper or, for memory utilisation,
higher): ``lo_vs_default``, ``lo_vs_pipeline`` and ``slo_cost`` (Gillis, :mod:`bench.suite.gillis`),
``mopar_vs_unsplit`` / ``mopar_vs_uniform`` (MOPAR, :mod:`bench.suite.mopar`), ``shm_vs_redis`` /
``shm_vs_inline`` (:mod:`bench.suite.transports`). The parallelism the machine has to spare is measured at
the start and reported: no split can beat it. Every response is checked against onnxruntime on the unsplit
model; errors are counted in the comparison and in ``all_correct``. The quick configuration uses small
variants and finishes in minutes on 2 cores; the full one uses the papers' models.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.provenance import machine
from bench.suite.comparison import Comparison
from bench.suite.config import ModelSpec, SuiteConfig, label
from bench.suite.gillis import lo_vs_default, lo_vs_pipeline, slo_cost
from bench.suite.mopar import mopar
from bench.suite.planning import InvokeFacts, invoke_facts
from bench.suite.transports import transports

__all__ = ["SECTIONS", "SuiteResult", "run_suite", "write_suite"]

log = logging.getLogger(__name__)

Section = Callable[[Any, ModelSpec, SuiteConfig, Path, Any, Callable[[str], None]], list[Comparison]]

SECTIONS: tuple[str, ...] = ("lo_vs_default", "lo_vs_pipeline", "slo_cost", "mopar", "transports")


@dataclass(frozen=True)
class SuiteResult:
    """The suite's comparisons (in the order run), the machine with the parallel speedup it had to spare at
    the start (``parallel_speedup_now``), the platform's invoke path measured then, and the seconds each
    section and model took. ``total_seconds`` None: a checkpoint of a run still going (``partial``)."""

    quick: bool
    machine: Mapping[str, Any]
    platform_invoke: InvokeFacts
    comparisons: tuple[Comparison, ...] = ()
    seconds: Mapping[str, float] = field(default_factory=dict)
    total_seconds: float | None = None

    @property
    def all_correct(self) -> bool:
        return all(c.correct for c in self.comparisons)

    @property
    def partial(self) -> bool:
        return self.total_seconds is None

    def to_json(self, *, with_samples: bool = True) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "benchmark": "suite", "quick": self.quick, "machine": dict(self.machine),
            "comparisons": [c.to_json(with_samples=with_samples) for c in self.comparisons], "skipped": [],
            "platform_invoke": self.platform_invoke.to_json(), "all_correct": self.all_correct,
            "seconds": dict(self.seconds),
        }
        if self.partial:
            doc["partial"] = True
        else:
            doc["total_seconds"] = self.total_seconds
        return doc


def run_suite(cfg: SuiteConfig, *, say: Callable[[str], None] | None = None, only: set[str] | None = None,
              checkpoint: Callable[[SuiteResult], object] | None = None) -> SuiteResult:
    """Run the comparisons ``only`` names (default: all, see :data:`SECTIONS`); ``checkpoint(result)`` after
    each, so a long run that is interrupted leaves what it measured. A comparison that fails is a row with
    ``source`` "failed" (and one error), not the end of the run."""
    from bench.load.background import parallel_speedup
    from serving.platform.process import PlatformProcess

    say = say or (lambda _m: None)
    t_begin = time.perf_counter()
    mach = machine()
    say("measuring the parallelism the machine has to spare")
    mach["parallel_speedup_now"] = round(parallel_speedup(), 3)
    sections: list[tuple[str, Section, tuple[ModelSpec, ...]]] = [
        ("lo_vs_default", lo_vs_default, cfg.lo_models),
        ("lo_vs_pipeline", lo_vs_pipeline, cfg.pipeline_models),
        ("slo_cost", slo_cost, (cfg.slo_model,)),
        ("mopar", mopar, cfg.mopar_models),
        ("transports", transports, cfg.lo_models[:1]),
    ]
    comparisons: list[Comparison] = []
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="flatpack-suite-") as tmp, PlatformProcess(idle_timeout_s=1800) as pp:
        work = Path(tmp)
        say("timing the platform's invoke path")
        facts = invoke_facts(pp, work)
        for name, fn, specs in sections:
            if only and name not in only:
                continue
            for spec in specs:
                t0 = time.perf_counter()
                try:
                    comparisons += fn(pp, spec, cfg, work, facts.invoke, say)
                except Exception as e:  # noqa: BLE001 - one comparison failing must not hide the others
                    log.exception("%s on %s failed", name, label(spec))
                    comparisons.append(Comparison(name, label(spec), None, 1, "failed",
                                                  notes=(f"{type(e).__name__}: {e}",)))
                seconds[f"{name}:{label(spec)}"] = round(time.perf_counter() - t0, 1)
                if checkpoint:
                    checkpoint(SuiteResult(cfg.quick, mach, facts, tuple(comparisons), dict(seconds)))
    return SuiteResult(cfg.quick, mach, facts, tuple(comparisons), seconds, round(time.perf_counter() - t_begin, 1))


def write_suite(result: SuiteResult, out: Path, *, plots: bool = True) -> list[Path]:
    """``suite[-quick].json`` under ``out``; with ``plots``, also the markdown report and the plots (every
    finite ratio as a bar, and each ``lo_vs_default``'s latency CDFs)."""
    from bench.harness.report import plot_bars, plot_latency_cdf, suite_markdown

    out.mkdir(parents=True, exist_ok=True)
    stem = "suite-quick" if result.quick else "suite"
    doc = result.to_json()
    if not plots:
        path = out / f"{stem}.json"
        path.write_text(json.dumps(doc, indent=1, default=str))
        return [path]
    plots_made: list[Path] = []
    rows: Sequence[tuple[str, float]] = [(f"{c.name} ({c.model})", c.ratio) for c in result.comparisons
                                         if isinstance(c.ratio, float) and np.isfinite(c.ratio)]
    if rows:
        plots_made.append(plot_bars(rows, out / f"{stem}-ratios.png", title="flatpack evaluation suite: ratios"))
    for c in result.comparisons:
        if c.name == "lo_vs_default" and c.samples_ms:
            tag = c.model.replace("/", "_").replace("@", "-")
            plots_made.append(plot_latency_cdf(c.samples_ms, out / f"{stem}-lo-default-{tag}.png",
                                               title=f"{c.model}: default vs lo (interleaved)"))
    paths = [out / f"{stem}.json", out / f"{stem}.md"]
    paths[0].write_text(json.dumps(doc, indent=1, default=str))
    paths[1].write_text(suite_markdown(doc, [str(p) for p in plots_made]))
    return paths + plots_made

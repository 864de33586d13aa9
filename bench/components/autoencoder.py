"""MOPAR's split-point autoencoders, accuracy cost against bytes saved (``flatpack bench autoencoder``).

For each model and each ratio R, one autoencoder is trained at a fixed split point (see ``CASES``) and
evaluated on held-out inputs:

* ``digits-cnn`` — the trained zoo model, scored on the real scikit-learn digits test split (540 images
  it never saw); the autoencoder trains on augmented images of the training split only.
* two random-weight zoo CNNs (``vgg11``, ``resnet18``, narrowed) on synthetic images: top-1 agreement
  with the uncompressed model and the relative output error (``classes`` shows how many distinct classes
  the uncompressed model predicts, since agreement means little when it predicts one for everything).

Each row has the bytes at the split before and after, the accuracy drop (or disagreement), the time the
encoder and decoder add, and the training time. The lossless codecs (zstd, lz4) are measured on the same
tensors. The end-to-end row deploys the uncompressed and the compressed two-stage bundle (each stage its
own function, same cut) on the local platform with the Redis transport, in alternating rounds, and reports
the median p50 latency of each and their ratio, measured in the same run.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.provenance import machine
from bench.harness.redis_server import available_redis
from zoo import BuildKwargs

__all__ = ["CASES", "QUICK_RATIOS", "RATIOS", "AutoencoderResult", "Case", "EndToEnd", "RatioFailure", "RatioResult",
           "run_autoencoders"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Case:
    """One model of the sweep: zoo name, build options and the unit the split lies after."""

    model: str
    split_after: int
    options: BuildKwargs = field(default_factory=BuildKwargs)

    @property
    def label(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.model}({opts})" if opts else self.model


CASES: tuple[Case, ...] = (
    Case("digits-cnn", 1),  # 32x16x16 after the first conv pair and pool
    Case("vgg11", 2, {"width_div": 4, "input_size": 32}),  # 64x8x8
    Case("resnet18", 2, {"width_div": 4, "input_size": 64}),  # 16x16x16 after the first residual block
)
RATIOS = (2.0, 4.0, 8.0, 16.0)
QUICK_RATIOS = (4.0,)


def _build(case: Case, root: Path) -> Path:
    from zoo import build_to_file

    path = root / f"{case.model}.onnx"
    if not path.exists():
        build_to_file(case.model, path, **case.options)
    return path


@dataclass(frozen=True)
class RatioResult:
    """One autoencoder at one ratio R: the split tensor's bytes before and after, the accuracy with and
    without it (or agreement and relative output error on random-weight models), the time it adds, its
    training time, whether it came from the cache, and the wall time of this row."""

    model: str
    split_after: int
    ratio: float
    shape_after: tuple[int, ...]
    bytes_before: int
    bytes_after: int
    accuracy_full: float | None
    accuracy_ae: float | None
    accuracy_drop: float
    agreement: float
    rel_err: float
    spread_err: float
    reconstruction_err: float
    classes: int
    added_ms: float
    train_seconds: float
    cached: bool
    wall_seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "split_after": self.split_after, "ratio": self.ratio,
                "shape_after": list(self.shape_after), "bytes_before": self.bytes_before,
                "bytes_after": self.bytes_after, "accuracy_full": self.accuracy_full, "accuracy_ae": self.accuracy_ae,
                "accuracy_drop": self.accuracy_drop, "agreement": self.agreement, "rel_err": self.rel_err,
                "spread_err": self.spread_err, "reconstruction_err": self.reconstruction_err, "classes": self.classes,
                "added_ms": self.added_ms, "train_seconds": self.train_seconds, "cached": self.cached,
                "wall_seconds": self.wall_seconds}


@dataclass(frozen=True)
class RatioFailure:
    """A ratio no autoencoder could be made for, and why."""

    model: str
    split_after: int
    ratio: float
    error: str

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "split_after": self.split_after, "ratio": self.ratio, "error": self.error}


@dataclass(frozen=True)
class EndToEnd:
    """The uncompressed and the compressed bundle on the local platform, in alternating rounds: each
    round's report per bundle (``runs``); ``skipped`` says why it did not run (then nothing else is set)."""

    model: str = ""
    split_after: int = 0
    ratio: float = 0.0
    transport: str = ""
    requests: int = 0
    rounds: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    runs: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    skipped: str | None = None

    def p50_ms(self, name: str) -> float:
        """The median over rounds of bundle ``name``'s p50."""
        return float(np.median([r["p50_ms"] for r in self.runs[name]]))

    @property
    def p50_ratio(self) -> float:
        return self.p50_ms("compressed") / self.p50_ms("uncompressed")

    def to_json(self) -> dict[str, Any]:
        if self.skipped is not None:
            return {"skipped": self.skipped}
        out: dict[str, Any] = {"model": self.model, "split_after": self.split_after, "ratio": self.ratio,
                               "transport": self.transport, "requests": self.requests, "rounds": self.rounds,
                               "bytes_before": self.bytes_before, "bytes_after": self.bytes_after}
        for name, rs in self.runs.items():
            out[name] = {"p50_ms": self.p50_ms(name), "correct": sum(r["correct"] for r in rs),
                         "requests": self.requests * self.rounds, "errors": sum(r["errors"] for r in rs),
                         "rounds": [dict(r) for r in rs]}
        out["p50_ratio"] = self.p50_ratio
        return out


def _end_to_end(model: Path, split_after: int, sc: Any, work: Path, *, transport: str, requests: int, rounds: int,
                redis_url: str | None) -> EndToEnd:
    """p50 latency of the uncompressed and the compressed bundle, in alternating rounds (A B, B A, ...) so
    that load drifting during the run hits both alike; the figure is the median of the rounds' p50s."""
    from autoencoder import load_model_graph, uncompressed_bundle, write_compressed_bundle
    from serving.runner import run_bundle

    lg, sha = load_model_graph(model)
    bundles = {"uncompressed": uncompressed_bundle(lg, split_after, work / "e2e-base"),
               "compressed": write_compressed_bundle(lg, sc, work / "e2e-ae", source_sha256=sha)}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in bundles}
    for k in range(rounds):
        for name in (("uncompressed", "compressed") if k % 2 == 0 else ("compressed", "uncompressed")):
            rep = run_bundle(bundles[name], transport=transport, requests=requests, overhead=False,
                             redis_url=redis_url, timeout_s=60)
            runs[name].append({"p50_ms": rep.p50_ms, "p99_ms": rep.p99_ms, "mean_ms": rep.mean_ms,
                               "correct": rep.correct, "errors": rep.errors, "cold_starts": rep.cold_starts,
                               "leftover_tensors": rep.leftover_tensors, "first_error": rep.first_error})
    return EndToEnd(lg.name, split_after, sc.ratio, transport, requests, rounds, sc.bytes_before, sc.bytes_after, runs)


@dataclass(frozen=True)
class AutoencoderResult:
    """Every (model, ratio) row, the lossless codecs on the same split tensors (each model once), the
    end-to-end comparison (None when not asked for), the sweep's configuration and the machine."""

    results: tuple[RatioResult | RatioFailure, ...]
    lossless: tuple[Mapping[str, Any], ...]
    end_to_end: EndToEnd | None
    config: Mapping[str, Any]
    machine: Mapping[str, Any] = field(default_factory=machine)

    def to_json(self) -> dict[str, Any]:
        return {"results": [r.to_json() for r in self.results], "lossless": [dict(r) for r in self.lossless],
                "end_to_end": self.end_to_end.to_json() if self.end_to_end is not None else None,
                "config": dict(self.config), "machine": dict(self.machine)}


def run_autoencoders(*, ratios: tuple[float, ...] = RATIOS, epochs: int = 30, cases: tuple[Case, ...] = CASES,
                     e2e: bool = True, e2e_ratio: float = 4.0, transport: str = "redis", requests: int = 50,
                     rounds: int = 3, redis_url: str | None = "redis://127.0.0.1:6379/0", use_cache: bool = True,
                     say: Callable[[str], None] | None = None) -> AutoencoderResult:
    """The sweep (see the module docstring). ``e2e``: the end-to-end comparison on digits-cnn at
    ``e2e_ratio`` over ``transport`` (redis: the server at ``redis_url`` if one answers, else one started for
    it, else skipped)."""
    from autoencoder import CompressionError, TrainConfig, compress_split

    say = say or (lambda _m: None)
    config = TrainConfig(epochs=epochs)
    results: list[RatioResult | RatioFailure] = []
    lossless: list[dict[str, Any]] = []
    e2e_out: EndToEnd | None = None
    with tempfile.TemporaryDirectory(prefix="flatpack-bench-ae-") as tmp:
        work = Path(tmp)
        for case in cases:
            say(f"building {case.label}")
            path = _build(case, work)
            for ratio in ratios:
                say(f"{case.label}: R={ratio:g} after unit {case.split_after}")
                t0 = time.perf_counter()
                try:
                    sc = compress_split(path, case.split_after, ratio, config=config, use_cache=use_cache)
                except CompressionError as e:
                    results.append(RatioFailure(case.label, case.split_after, ratio, str(e)))
                    continue
                f = sc.fidelity
                results.append(RatioResult(
                    case.label, case.split_after, ratio, tuple(sc.code_shape), sc.bytes_before, sc.bytes_after,
                    f.accuracy_full, f.accuracy_ae, f.accuracy_drop, f.agreement, f.rel_err, f.spread_err,
                    f.reconstruction_err, f.classes, sc.added_ms, sc.train_seconds, sc.cached,
                    time.perf_counter() - t0))
                if not any(r["model"] == case.label for r in lossless):
                    lossless.extend({"model": case.label, "split_after": case.split_after, **r.to_json()}
                                    for r in sc.lossless)
                if e2e and case.model == "digits-cnn" and ratio == e2e_ratio:
                    with available_redis(redis_url if transport == "redis" else None) as url:
                        if transport == "redis" and url is None:
                            e2e_out = EndToEnd(skipped="no Redis answers and no redis-server on PATH")
                        else:
                            say(f"end to end: {transport}, {requests} requests per bundle")
                            e2e_out = _end_to_end(path, case.split_after, sc, work, transport=transport,
                                                  requests=requests, rounds=rounds, redis_url=url)
    cfg = {"ratios": list(ratios), "train": config.to_json(), "cases": [c.label for c in cases],
           "e2e_ratio": e2e_ratio, "transport": transport, "requests": requests, "rounds": rounds}
    return AutoencoderResult(tuple(results), tuple(lossless), e2e_out, cfg)

"""`flatpack bench autoencoder`: MOPAR's split-point autoencoders, accuracy cost against bytes saved.

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

import json
import logging
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np
from rich.console import Console
from rich.table import Table

__all__ = ["CASES", "Case", "autoencoder_cmd", "run"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Case:
    """One model of the sweep: zoo name, build options and the unit the split lies after."""

    model: str
    split_after: int
    options: tuple[tuple[str, int], ...] = ()

    @property
    def label(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in self.options)
        return f"{self.model}({opts})" if opts else self.model


CASES: tuple[Case, ...] = (
    Case("digits-cnn", 1),  # 32x16x16 after the first conv pair and pool
    Case("vgg11", 2, (("width_div", 4), ("input_size", 32))),  # 64x8x8
    Case("resnet18", 2, (("width_div", 4), ("input_size", 64))),  # 16x16x16 after the first residual block
)
RATIOS = (2.0, 4.0, 8.0, 16.0)
QUICK_RATIOS = (4.0,)


def _build(case: Case, root: Path) -> Path:
    from bench.zoo import build_to_file

    path = root / f"{case.model}.onnx"
    if not path.exists():
        build_to_file(case.model, path, **dict(case.options))
    return path


def _redis_answers(url: str) -> bool:
    try:
        import redis
    except ImportError:
        return False
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=1).ping())
    except (redis.exceptions.RedisError, OSError):
        return False


@contextmanager
def _redis(url: str | None) -> Iterator[str | None]:
    """``url`` if a server answers there, else a redis-server this benchmark starts (and stops), else None."""
    if url and _redis_answers(url):
        yield url
        return
    server = shutil.which("redis-server")
    if server is None:
        yield None
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],  # noqa: S603 - a fixed binary from PATH
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    mine = f"redis://127.0.0.1:{port}/0"
    try:
        for _ in range(100):
            if _redis_answers(mine):
                break
            time.sleep(0.05)
        yield mine if _redis_answers(mine) else None
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _end_to_end(model: Path, split_after: int, sc: Any, work: Path, *, transport: str, requests: int, rounds: int,
                redis_url: str | None) -> dict[str, Any]:
    """p50 latency of the uncompressed and the compressed bundle, in alternating rounds (A B, B A, ...) so
    that load drifting during the run hits both alike; the figure is the median of the rounds' p50s."""
    from autoencoder import load_model_graph, uncompressed_bundle, write_compressed_bundle
    from serving.platform.runner import run_bundle

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
    out: dict[str, Any] = {"model": lg.name, "split_after": split_after, "ratio": sc.ratio, "transport": transport,
                           "requests": requests, "rounds": rounds, "bytes_before": sc.bytes_before,
                           "bytes_after": sc.bytes_after}
    for name, rs in runs.items():
        out[name] = {"p50_ms": float(np.median([r["p50_ms"] for r in rs])),
                     "correct": sum(r["correct"] for r in rs), "requests": requests * rounds,
                     "errors": sum(r["errors"] for r in rs), "rounds": rs}
    out["p50_ratio"] = out["compressed"]["p50_ms"] / out["uncompressed"]["p50_ms"]
    return out


def run(*, ratios: tuple[float, ...] = RATIOS, epochs: int = 30, cases: tuple[Case, ...] = CASES,
        e2e: bool = True, e2e_ratio: float = 4.0, transport: str = "redis", requests: int = 50, rounds: int = 3,
        redis_url: str | None = "redis://127.0.0.1:6379/0", use_cache: bool = True,
        console: Console | None = None) -> dict[str, Any]:
    """The sweep; returns ``{"results", "lossless", "end_to_end", "config", "machine"}``."""
    from autoencoder import CompressionError, TrainConfig, compress_split
    from bench.provenance import machine

    config = TrainConfig(epochs=epochs)
    results: list[dict[str, Any]] = []
    lossless: list[dict[str, Any]] = []
    e2e_out: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="flatpack-bench-ae-") as tmp:
        work = Path(tmp)
        for case in cases:
            if console:
                console.log(f"building {case.label}")
            path = _build(case, work)
            for ratio in ratios:
                if console:
                    console.log(f"{case.label}: R={ratio:g} after unit {case.split_after}")
                t0 = time.perf_counter()
                try:
                    sc = compress_split(path, case.split_after, ratio, config=config, use_cache=use_cache)
                except CompressionError as e:
                    results.append({"model": case.label, "split_after": case.split_after, "ratio": ratio,
                                    "error": str(e)})
                    continue
                f = sc.fidelity
                results.append({
                    "model": case.label, "split_after": case.split_after, "ratio": ratio,
                    "shape_after": list(sc.code_shape), "bytes_before": sc.bytes_before,
                    "bytes_after": sc.bytes_after, "accuracy_full": f.accuracy_full, "accuracy_ae": f.accuracy_ae,
                    "accuracy_drop": f.accuracy_drop, "agreement": f.agreement, "rel_err": f.rel_err,
                    "spread_err": f.spread_err, "reconstruction_err": f.reconstruction_err, "classes": f.classes,
                    "added_ms": sc.added_ms, "train_seconds": sc.train_seconds, "cached": sc.cached,
                    "wall_seconds": time.perf_counter() - t0,
                })
                if not any(r["model"] == case.label for r in lossless):
                    lossless.extend({"model": case.label, "split_after": case.split_after, **r.to_json()}
                                    for r in sc.lossless)
                if e2e and case.model == "digits-cnn" and ratio == e2e_ratio:
                    with _redis(redis_url if transport == "redis" else None) as url:
                        if transport == "redis" and url is None:
                            e2e_out = {"skipped": "no Redis answers and no redis-server on PATH"}
                        else:
                            if console:
                                console.log(f"end to end: {transport}, {requests} requests per bundle")
                            e2e_out = _end_to_end(path, case.split_after, sc, work, transport=transport,
                                                  requests=requests, rounds=rounds, redis_url=url)
    return {
        "results": results,
        "lossless": lossless,
        "end_to_end": e2e_out,
        "config": {"ratios": list(ratios), "train": config.to_json(), "cases": [c.label for c in cases],
                   "e2e_ratio": e2e_ratio, "transport": transport, "requests": requests, "rounds": rounds},
        "machine": machine(),
    }


def _fmt(v: Any, spec: str = ".4g") -> str:
    if v is None:
        return "-"
    return format(v, spec) if isinstance(v, float) else str(v)


def _print(doc: dict[str, Any], console: Console) -> None:
    t = Table(title="split-point autoencoders: accuracy drop (or disagreement) vs compression ratio")
    for col in ("model", "split", "R", "code", "bytes", "acc full", "acc AE", "drop", "agree", "rel err",
                "spread err", "classes", "added ms", "train s"):
        t.add_column(col, justify="left" if col in ("model", "code") else "right")
    for r in doc["results"]:
        if "error" in r:
            t.add_row(r["model"], str(r["split_after"]), f"{r['ratio']:g}", r["error"][:60], *[""] * 10)
            continue
        t.add_row(r["model"], str(r["split_after"]), f"{r['ratio']:g}", "x".join(map(str, r["shape_after"][1:])),
                  f"{r['bytes_before']}->{r['bytes_after']}", _fmt(r["accuracy_full"]), _fmt(r["accuracy_ae"]),
                  _fmt(r["accuracy_drop"]), _fmt(r["agreement"]), _fmt(r["rel_err"], ".3g"),
                  _fmt(r["spread_err"], ".3g"), str(r["classes"]),
                  _fmt(r["added_ms"], ".3f"), _fmt(r["train_seconds"], ".1f"))
    console.print(t)
    lt = Table(title="lossless codecs on the same split tensors")
    for col in ("model", "codec", "ratio", "bytes", "compress ms", "decompress ms", "wire"):
        lt.add_column(col, justify="left" if col in ("model", "codec") else "right")
    for r in doc["lossless"]:
        label = r["codec"] if r["level"] is None else f"{r['codec']}-{r['level']}"
        lt.add_row(r["model"], label, f"{r['ratio']:.3g}", f"{r['bytes_before']}->{r['bytes_after']:.0f}",
                   f"{r['compress_ms']:.3f}", f"{r['decompress_ms']:.3f}", "yes" if r["wire"] else "no")
    console.print(lt)
    e = doc.get("end_to_end")
    if e:
        if "skipped" in e:
            console.print(f"end to end: skipped ({e['skipped']})")
        else:
            u, c = e["uncompressed"], e["compressed"]
            console.print(
                f"end to end ({e['model']}, R={e['ratio']:g}, {e['transport']}, {e['rounds']} alternating rounds of "
                f"{e['requests']} requests): median p50 {u['p50_ms']:.2f} ms uncompressed, {c['p50_ms']:.2f} ms "
                f"compressed (ratio {e['p50_ratio']:.3f}); correct {u['correct']}/{u['requests']} and "
                f"{c['correct']}/{c['requests']}")


@click.command("autoencoder")
@click.option("--quick", is_flag=True, help="R=4 only, 8 epochs, one end-to-end round of 20 requests.")
@click.option("--ratios", default=None, help="Comma-separated ratios (default 2,4,8,16).")
@click.option("--epochs", type=click.IntRange(min=1), default=None, help="Training epochs (default 30).")
@click.option("--e2e/--no-e2e", default=True, show_default=True,
              help="Measure end-to-end latency of digits-cnn uncompressed vs compressed on the local platform.")
@click.option("--transport", type=click.Choice(["redis", "shm", "inline"]), default="redis", show_default=True)
@click.option("--requests", type=click.IntRange(min=1), default=None,
              help="End-to-end requests per bundle and round (50; quick 20).")
@click.option("--rounds", type=click.IntRange(min=1), default=None,
              help="Alternating end-to-end rounds per bundle (3; quick 1).")
@click.option("--redis-url", envvar="FLATPACK_REDIS_URL", default="redis://127.0.0.1:6379/0", show_default=True,
              help="Used if a server answers; else a redis-server is started for the run.")
@click.option("--no-cache", is_flag=True, help="Train every autoencoder anew (and do not cache them).")
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the JSON result here.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def autoencoder_cmd(quick: bool, ratios: str | None, epochs: int | None, e2e: bool, transport: str,
                    requests: int | None, rounds: int | None, redis_url: str, no_cache: bool, out: Path | None,
                    as_json: bool) -> None:
    """Sweep the compression ratio R on digits-cnn (accuracy on real held-out digits) and two random-weight
    CNNs (agreement, relative error); lossless codecs on the same tensors; end-to-end latency change."""
    try:
        ratio_list = tuple(float(r) for r in ratios.split(",")) if ratios else (QUICK_RATIOS if quick else RATIOS)
    except ValueError as e:
        raise click.ClickException(f"--ratios {ratios!r}: {e}") from e
    err = Console(stderr=True)
    doc = run(ratios=ratio_list, epochs=epochs or (8 if quick else 30), e2e=e2e,
              e2e_ratio=4.0 if 4.0 in ratio_list else ratio_list[0], transport=transport,
              requests=requests or (20 if quick else 50), rounds=rounds or (1 if quick else 3), redis_url=redis_url,
              use_cache=not no_cache,
              console=err)
    text = json.dumps(doc, default=float)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1, default=float) + "\n")
    if as_json:
        click.echo(text)
    else:
        _print(doc, Console())

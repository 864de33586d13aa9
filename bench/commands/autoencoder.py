"""``flatpack bench autoencoder``: MOPAR's split-point autoencoders (:mod:`bench.components.autoencoder`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from bench.commands.output import emit
from bench.components.autoencoder import QUICK_RATIOS, RATIOS, AutoencoderResult, RatioFailure, run_autoencoders

__all__ = ["autoencoder_cmd"]


def _fmt(v: Any, spec: str = ".4g") -> str:
    if v is None:
        return "-"
    return format(v, spec) if isinstance(v, float) else str(v)


def _print(result: AutoencoderResult) -> None:
    from rich.table import Table

    from serving.console import console

    t = Table(title="split-point autoencoders: accuracy drop (or disagreement) vs compression ratio")
    for col in ("model", "split", "R", "code", "bytes", "acc full", "acc AE", "drop", "agree", "rel err",
                "spread err", "classes", "added ms", "train s"):
        t.add_column(col, justify="left" if col in ("model", "code") else "right")
    for r in result.results:
        if isinstance(r, RatioFailure):
            t.add_row(r.model, str(r.split_after), f"{r.ratio:g}", r.error[:60], *[""] * 10)
            continue
        t.add_row(r.model, str(r.split_after), f"{r.ratio:g}", "x".join(map(str, r.shape_after[1:])),
                  f"{r.bytes_before}->{r.bytes_after}", _fmt(r.accuracy_full), _fmt(r.accuracy_ae),
                  _fmt(r.accuracy_drop), _fmt(r.agreement), _fmt(r.rel_err, ".3g"), _fmt(r.spread_err, ".3g"),
                  str(r.classes), _fmt(r.added_ms, ".3f"), _fmt(r.train_seconds, ".1f"))
    console.print(t)
    lt = Table(title="lossless codecs on the same split tensors")
    for col in ("model", "codec", "ratio", "bytes", "compress ms", "decompress ms", "wire"):
        lt.add_column(col, justify="left" if col in ("model", "codec") else "right")
    for row in result.lossless:
        label = row["codec"] if row["level"] is None else f"{row['codec']}-{row['level']}"
        lt.add_row(row["model"], label, f"{row['ratio']:.3g}", f"{row['bytes_before']}->{row['bytes_after']:.0f}",
                   f"{row['compress_ms']:.3f}", f"{row['decompress_ms']:.3f}", "yes" if row["wire"] else "no")
    console.print(lt)
    e = result.end_to_end
    if e is None:
        return
    if e.skipped is not None:
        console.print(f"end to end: skipped ({e.skipped})")
        return
    doc = e.to_json()
    u, c = doc["uncompressed"], doc["compressed"]
    console.print(
        f"end to end ({e.model}, R={e.ratio:g}, {e.transport}, {e.rounds} alternating rounds of {e.requests} "
        f"requests): median p50 {u['p50_ms']:.2f} ms uncompressed, {c['p50_ms']:.2f} ms compressed (ratio "
        f"{e.p50_ratio:.3f}); correct {u['correct']}/{u['requests']} and {c['correct']}/{c['requests']}")


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
    from serving.console import err_console

    try:
        ratio_list = tuple(float(r) for r in ratios.split(",")) if ratios else (QUICK_RATIOS if quick else RATIOS)
    except ValueError as e:
        raise click.ClickException(f"--ratios {ratios!r}: {e}") from e
    result = run_autoencoders(ratios=ratio_list, epochs=epochs or (8 if quick else 30), e2e=e2e,
                              e2e_ratio=4.0 if 4.0 in ratio_list else ratio_list[0], transport=transport,
                              requests=requests or (20 if quick else 50), rounds=rounds or (1 if quick else 3),
                              redis_url=redis_url, use_cache=not no_cache, say=err_console.log)
    if not emit(result.to_json(), out=out, as_json=as_json, default=float):
        _print(result)

"""``flatpack bench backends``: per-part latency of onnxruntime vs MXNet (:mod:`bench.components.backends`)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from bench.commands.output import emit
from bench.components.backends import BackendsResult, measure, small_vgg11

__all__ = ["backends_cmd"]


def _print(result: BackendsResult, *, threads: int, reps: int, saved: Path) -> None:
    from rich.table import Table

    from serving.console import console

    t = Table(title=f"per-part latency, {threads} thread(s), median of {reps} (ratio = MXNet / onnxruntime)")
    for c in ("part", "onnxruntime ms", "mxnet ms", "ratio", "max rel err"):
        t.add_column(c, justify="left" if c == "part" else "right")
    for r in result.parts:
        t.add_row(r.part, f"{r.onnxruntime_p50_ms:.3f}", f"{r.mxnet_p50_ms:.3f}", f"{r.ratio_mxnet_to_onnxruntime:.2f}",
                  f"{r.max_rel_err:.1e}")
    console.print(t)
    sums = result.sum_p50_ms
    console.print(f"geometric mean ratio {result.geomean_ratio:.2f}; sum of medians {sums['onnxruntime']:.2f} ms "
                  f"(onnxruntime) vs {sums['mxnet']:.2f} ms (MXNet); largest difference {result.max_rel_err:.1e}; "
                  f"saved to {saved}")


@click.command("backends")
@click.argument("bundle", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--reps", type=click.IntRange(min=3), default=30, show_default=True, help="Timed runs per part.")
@click.option("--warmup", type=click.IntRange(min=1), default=3, show_default=True, help="Untimed runs first.")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="Threads of both backends (a small function's vCPU share).")
@click.option("--out", type=click.Path(file_okay=False), default="bench/results", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def backends_cmd(bundle: Path | None, reps: int, warmup: int, threads: int, out: str, as_json: bool) -> None:
    """Per-part latency of onnxruntime vs MXNet on the same parts (BUNDLE, default: a small VGG-11)."""
    from serving.console import err_console
    from serving.platform.runtimes import BackendEnvError, require_backend

    try:
        require_backend("mxnet", bundle=bundle, notice=err_console.print,
                        progress=None if as_json else (lambda m: err_console.print(f"[dim]{m}[/]")))
    except BackendEnvError as e:
        raise click.ClickException(str(e)) from e
    with tempfile.TemporaryDirectory(prefix="flatpack-bench-vgg-") as tmp:
        b = bundle or small_vgg11(Path(tmp))
        try:
            result = measure(b, reps=reps, warmup=warmup, threads=threads)
        except RuntimeError as e:
            raise click.ClickException(str(e)) from e
    saved = Path(out) / "backends.json"
    if not emit(result.to_json(), out=saved, as_json=as_json):
        _print(result, threads=threads, reps=reps, saved=saved)

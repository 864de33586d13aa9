"""`flatpack run BUNDLE`: the bundle as real functions on the local platform, checked against the model."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from functions.compare import DEFAULT_TOLERANCE
from functions.settings import redis_url
from serving.console import console, err_console

__all__ = ["run_cmd"]


@click.command("run")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--transport", type=click.Choice(["shm", "redis", "inline", "s3"]), default="shm", show_default=True,
              help="How tensors move between functions.")
@click.option("--requests", "n_requests", type=click.IntRange(min=1), default=20, show_default=True,
              help="Requests to send, each with its own random input.")
@click.option("--concurrency", type=click.IntRange(min=1), default=1, show_default=True,
              help="Client threads sending requests at once.")
@click.option("--max-instances", type=click.IntRange(min=1), default=None,
              help="Instances per function at most (default: --concurrency).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the first request's input.")
@click.option("--timeout-s", type=float, default=60.0, show_default=True, help="Deadline of one request.")
@click.option("--tolerance", type=float, default=DEFAULT_TOLERANCE, show_default=True,
              help="Largest relative error counted as correct.")
@click.option("--redis-url", default=redis_url, show_default="$FLATPACK_REDIS_URL or redis://127.0.0.1:6379/0",
              help="Redis for --transport redis.")
@click.option("--s3-endpoint-url", default=None,
              help="S3 endpoint for --transport s3 (default: moto's server, started for the run).")
@click.option("--s3-bucket", default="flatpack-tensors", show_default=True)
@click.option("--overhead/--no-overhead", default=True, show_default=True,
              help="Also measure a one-part bundle vs onnxruntime in-process (overhead_ratio).")
@click.option("--backend", type=click.Choice(["onnxruntime", "mxnet"]), default="onnxruntime", show_default=True,
              help="What runs the parts in the functions (mxnet: its own environment, made on first use).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def run_cmd(bundle: Path, transport: str, n_requests: int, concurrency: int, max_instances: int | None, seed: int,
            timeout_s: float, tolerance: float, redis_url: str, s3_endpoint_url: str | None, s3_bucket: str,
            overhead: bool, backend: str, as_json: bool) -> None:
    """Deploy BUNDLE on the local platform, send requests with random inputs, and check every output
    against the unsplit model. Exits non-zero if any output is wrong or tensors are left behind."""
    from functions.bundle import Bundle, BundleError
    from functions.errors import FunctionError

    try:
        from serving.runner import run_bundle
    except ImportError as e:
        raise click.ClickException(
            f"the local platform needs {e.name}: pip install 'flatpack[server]' (and [redis] / [aws] for those "
            f"transports)"
        ) from e

    try:
        Bundle.load(bundle)
    except BundleError as e:
        raise click.ClickException(str(e)) from e
    from serving.cli.backend import require_backend

    require_backend(backend, bundle=bundle)
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=True, disable=as_json) as bar:
        task = bar.add_task(f"{transport}, {backend}: requests", total=n_requests)
        try:
            report = run_bundle(
                bundle, transport=transport, requests=n_requests, concurrency=concurrency, seed=seed,
                max_instances=max_instances, timeout_s=timeout_s, tolerance=tolerance, overhead=overhead,
                redis_url=redis_url if transport == "redis" else None, s3_endpoint_url=s3_endpoint_url,
                s3_bucket=s3_bucket, progress=lambda n: bar.advance(task, n), backend=backend,
            )
        except FunctionError as e:
            raise click.ClickException(f"{e.message}") from e
        except OSError as e:
            raise click.ClickException(f"cannot start the local platform: {e}") from e
    doc = report.to_json()
    if as_json:
        doc.pop("functions", None)
        click.echo(json.dumps(doc))
    else:
        _table(doc)
    if not report.ok:
        why = []
        if report.correct < report.requests:
            why.append(f"{report.requests - report.correct} of {report.requests} requests wrong or failed"
                       + (f" (first error: {report.first_error})" if report.first_error else ""))
        if report.leftover_tensors:
            why.append(f"{report.leftover_tensors} tensor(s) left in the transport")
        raise click.ClickException("; ".join(why))


def _table(doc: dict) -> None:
    t = Table(title=f"flatpack run: {doc['bundle']} over {doc['transport']} with {doc.get('backend', 'onnxruntime')}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k in ("requests", "correct", "errors", "max_rel_err", "p50_ms", "p99_ms", "mean_ms", "throughput_rps",
              "billed_gb_s", "cold_starts", "invocations", "leftover_tensors", "inprocess_p50_ms", "one_part_p50_ms",
              "overhead_ratio", "split_vs_inprocess"):
        v = doc.get(k)
        t.add_row(k, "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v)))
    console.print(t)
    f = Table(title="per function (billing meter)")
    for c in ("function", "memory_mb", "invocations", "cold_starts", "errors", "billed_gb_s", "max_rss_mb"):
        f.add_column(c, justify="right" if c != "function" else "left")
    for name, v in doc.get("functions", {}).items():
        f.add_row(name, str(v["memory_mb"]), str(v["invocations"]), str(v["cold_starts"]), str(v["errors"]),
                  f"{v['billed_gb_s']:.4g}", f"{v['max_rss_mb']:.0f}")
    console.print(f)

"""`flatpack compress`: train and evaluate one split-point autoencoder, optionally write a compressed bundle."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from serving.cli.models import resolve_model
from serving.console import console, err_console, status

__all__ = ["compress_cmd"]

_PHASES = {"activations": "collecting activations", "training": "training the autoencoder",
           "evaluating": "evaluating on held-out inputs"}


@contextmanager
def _user_errors() -> Iterator[None]:
    """Domain errors become one clear line (no traceback)."""
    from autoencoder import CompressionError
    from functions.bundle import BundleError
    from partitioner.errors import ExportError, ModelError, SpecError

    try:
        yield
    except (CompressionError, ModelError, SpecError, ExportError, BundleError) as e:
        raise click.ClickException(str(e)) from e


def _stride(value: str) -> int:
    return 0 if value == "auto" else int(value)


@click.command("compress")
@click.argument("model")
@click.option("--split-after", "split_after", type=int, required=True, metavar="UNIT",
              help="Compress the tensor after this unit (see `flatpack inspect`).")
@click.option("--ratio", type=float, required=True, metavar="R",
              help="Compression ratio |T| / |T_encoded| to reach at least (> 1).")
@click.option("--epochs", type=click.IntRange(min=1), default=30, show_default=True, help="Training epochs.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seeds augmentation, weights and batch order.")
@click.option("--stride", type=click.Choice(["auto", "1", "2"]), default="auto", show_default=True,
              help="Encoder stride: 1 keeps the resolution and cuts channels, 2 halves it.")
@click.option("--calibration", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help=".npz with x_train, x_test (and optionally y_test) to train and evaluate on "
                   "(default: real digits for digits-cnn, synthetic images otherwise).")
@click.option("--no-cache", is_flag=True, help="Train anew and do not write the autoencoder cache.")
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also write a verified two-stage compressed bundle to this directory.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def compress_cmd(model: str, split_after: int, ratio: float, epochs: int, seed: int, stride: str,
                 calibration: Path | None, no_cache: bool, output: Path | None, as_json: bool) -> None:
    """Train an autoencoder for the split after UNIT of MODEL (an ONNX file or a zoo model name) at ratio R,
    and report bytes before/after, accuracy (or top-1 agreement) with and without it, and the time it adds.

    Trained autoencoders are cached by model, split tensor, ratio and settings, under
    $FLATPACK_CACHE_DIR/autoencoders (default ~/.cache/flatpack/autoencoders).
    """
    from autoencoder import (
        TrainConfig,
        compress_split,
        design_for,
        load_calibration,
        load_model_graph,
        split_point,
        write_compressed_bundle,
    )

    if not ratio > 1 or not math.isfinite(ratio):
        raise click.ClickException(f"--ratio must be a number above 1, got {ratio:g}")
    source = resolve_model(model)
    with _user_errors():
        config = TrainConfig(epochs=epochs, seed=seed, stride=_stride(stride))
        lg, sha = load_model_graph(source)
        design_for(split_point(lg, split_after).shape, ratio, stride=config.stride)  # fail before the progress bar
        calib = load_calibration(calibration, lg.model) if calibration is not None else None
        with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=err_console, transient=True) as bar:
            tasks: dict[str, TaskID] = {}

            def progress(phase: str, done: int, total: int) -> None:
                if phase not in tasks:
                    tasks[phase] = bar.add_task(_PHASES.get(phase, phase), total=total)
                bar.update(tasks[phase], completed=done, total=total)

            sc = compress_split(lg, split_after, ratio, config=config, calibration=calib, use_cache=not no_cache,
                                progress=progress)
        doc = sc.to_json()
        if output is not None:
            with status(f"writing and verifying the compressed bundle {output}"):
                write_compressed_bundle(lg, sc, output, source_sha256=sha)
            doc["bundle"] = str(output)
    if as_json:
        click.echo(json.dumps(doc))
        return
    _table(doc)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _table(doc: dict[str, Any]) -> None:
    t = Table(title=f"{doc['model']}: autoencoder after unit {doc['split_after']} at R={doc['ratio']:g}"
                    + (" (cached)" if doc["cached"] else ""))
    t.add_column("metric")
    t.add_column("value", justify="right")
    before, after = ("x".join(map(str, doc[k])) for k in ("shape_before", "shape_after"))
    rows = [
        ("tensor", doc["tensor"]),
        ("shape before / after", f"{before} -> {after}"),
        ("bytes before / after", f"{doc['bytes_before']} -> {doc['bytes_after']} ({doc['achieved_ratio']:.3g}x)"),
        ("accuracy full / with AE", f"{_fmt(doc['accuracy_full'])} / {_fmt(doc['accuracy_ae'])}"),
        ("accuracy drop" if doc["accuracy_full"] is not None else "disagreement", _fmt(doc["accuracy_drop"])),
        ("top-1 agreement", _fmt(doc["agreement"])),
        ("output rel err (mean)", _fmt(doc["rel_err"])),
        ("reconstruction rel err", _fmt(doc["reconstruction_err"])),
        ("added ms (encoder + decoder)", _fmt(doc["added_ms"])),
        ("train seconds / samples", f"{doc['train_seconds']:.1f} / {doc['train_samples']}"),
        ("calibration", doc["calibration"]),
    ]
    for r in doc["lossless"]:
        label = r["codec"] if r["level"] is None else f"{r['codec']}-{r['level']}"
        rows.append((f"lossless {label}", f"{r['ratio']:.3g}x, {r['compress_ms'] + r['decompress_ms']:.3g} ms"))
    if "bundle" in doc:
        rows.append(("bundle", doc["bundle"]))
    for k, v in rows:
        t.add_row(k, _fmt(v))
    console.print(t)

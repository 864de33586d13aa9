"""`flatpack inspect`, `flatpack export` and `flatpack verify`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

__all__ = ["export_cmd", "inspect_cmd", "verify_cmd"]

from functions.compare import DEFAULT_TOLERANCE
from serving.cli.shapes import shape_options
from serving.console import console as _console
from serving.console import err_console as _err

if TYPE_CHECKING:  # the partitioner is imported when a command runs
    from partitioner.graph import LayerGraph
    from partitioner.normalize import ShapeFixes



@contextmanager
def _user_errors() -> Iterator[None]:
    """Turn the partitioner's domain errors into one clear line (no traceback)."""
    from functions.bundle import BundleError
    from partitioner.errors import ExportError, ModelError, SpecError

    try:
        yield
    except (ModelError, SpecError, ExportError, BundleError) as e:
        raise click.ClickException(str(e)) from e


def _load(model: str, shapes: ShapeFixes) -> LayerGraph:
    from partitioner.graph import LayerGraph

    with _err.status(f"loading {model}"):
        return LayerGraph.load(model, shapes.inputs, shapes.dims)


def _mb(n: int) -> str:
    return f"{n / 2**20:.2f}"


@click.command("inspect")
@click.argument("model", type=click.Path(dir_okay=False))
@shape_options
@click.option("--json", "as_json", is_flag=True, help="Print the units as JSON.")
def inspect_cmd(model: str, shapes: ShapeFixes, as_json: bool) -> None:
    """Show the layer graph of MODEL: units, cut tensors, FLOPs, bytes and split families."""
    from partitioner.options import unit_families, unit_refusals

    with _user_errors():
        lg = _load(model, shapes)
        families = {u.index: unit_families(lg, u.index) for u in lg.units}
        why_not = {u.index: unit_refusals(lg, u.index) if not families[u.index] else {} for u in lg.units}
    if as_json:
        units = [
            {
                "index": u.index, "ops": list(u.ops), "nodes": len(u.nodes), "input": u.input, "output": u.output,
                "output_shape": list(lg.tensors[u.output].shape) if u.output in lg.tensors else None,
                "flops": u.flops, "weight_bytes": u.weight_bytes, "input_bytes": u.input_bytes,
                "output_bytes": u.output_bytes, "activation_bytes": u.activation_bytes,
                "families": families[u.index],
                **({"no_split": why_not[u.index]} if why_not[u.index] else {}),
            }
            for u in lg.units
        ]
        click.echo(json.dumps({"model": lg.name, **lg.summary(), "units": units}, indent=1))
        return
    table = Table(title=f"{lg.name}: {len(lg.units)} units, {len(lg.nodes)} nodes")
    for col in ("unit", "ops", "nodes", "output shape", "MFLOPs", "weights MB", "out MB", "families"):
        table.add_column(col, justify="right" if col in ("unit", "nodes", "MFLOPs", "weights MB", "out MB") else "left")
    for u in lg.units:
        shape = "x".join(map(str, lg.tensors[u.output].shape)) if u.output in lg.tensors else "?"
        table.add_row(str(u.index), u.label, str(len(u.nodes)), shape, f"{u.flops / 1e6:.1f}", _mb(u.weight_bytes),
                      _mb(u.output_bytes), ", ".join(families[u.index]) or "-")
    _console.print(table)
    for u in lg.units:
        if why_not[u.index]:
            reasons = "; ".join(f"{f}: {why}" for f, why in why_not[u.index].items())
            _console.print(f"unit {u.index} ({u.label}) has no split family: {reasons}")
    s = lg.summary()
    _console.print(f"total {s['flops'] / 1e9:.3f} GFLOPs, {_mb(s['weight_bytes'])} MB of weights; "
                   f"inputs {', '.join(lg.inputs)}; outputs {', '.join(lg.outputs)}")


@click.command("export")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--stages", required=True, metavar="SPEC",
              help='Stages by unit index, e.g. "0-4:spatial=2x2,5-9:channel=4,10-:none" '
                   "(families: none, spatial=GHxGW, channel=N, reduction=N, heads=N, embedding=N); a stage may "
                   "say where its parts run as `flatpack plan` prints it: [m+w] (part 0 on the master, the "
                   "default) or [w] (all on workers), with @MB for the workers' memory, e.g. 0-5:spatial=2x2[w@512].")
@click.option("-o", "--output", "out", required=True, type=click.Path(file_okay=False), help="Bundle directory.")
@shape_options
@click.option("--tolerance", default=DEFAULT_TOLERANCE, show_default=True,
              help="Max relative error the parts may show.")
@click.option("--backend", type=click.Choice(["onnxruntime", "mxnet"]), default="onnxruntime", show_default=True,
              help="Write parts this backend imports (mxnet: opset 13, initializers as inputs; refuses ops it lacks).")
@click.option("--memory", "memory_mb", type=click.IntRange(128, 10240), default=None,
              help="Memory (MB) of every function of the plan (default: what the model needs).")
def export_cmd(model: str, stages: str, out: str, shapes: ShapeFixes, tolerance: float,
               backend: str, memory_mb: int | None) -> None:
    """Cut MODEL into per-part ONNX files as --stages says, verify them, and write a bundle."""
    from partitioner.export import export_bundle

    with _user_errors():
        lg = _load(model, shapes)
        with _err.status("exporting") as status:
            from partitioner.export import Placement
            from partitioner.spec import parse_stages, stage_placements

            n = len(parse_stages(stages, len(lg.units)))
            placed = stage_placements(stages)
            placements = None
            if placed is not None:
                placements = [Placement(master, mb or memory_mb or 0) for master, mb in placed]
            elif memory_mb is not None:
                placements = [Placement(True, memory_mb)] * n
            path = export_bundle(lg, stages, out, tolerance=tolerance, progress=lambda msg: status.update(msg),
                                 backend=backend, master_mb=memory_mb, placements=placements)
    from functions.bundle import Bundle

    b = Bundle.load(path)
    v = b.manifest.get("verification", {})
    _console.print(f"[green]wrote[/] {path}: {len(b.plan.stages)} stages, "
                   f"{sum(len(s.parts) for s in b.plan.stages)} parts on {len(b.plan.functions)} functions, "
                   f"verified (max relative error {v.get('max_rel_err', float('nan')):.2e})")


@click.command("verify")
@click.argument("target", type=click.Path(exists=True))
@click.option("--all-options", is_flag=True, help="MODEL: check every admissible split option of every unit.")
@shape_options
@click.option("--seed", default=0, show_default=True)
@click.option("--tolerance", default=DEFAULT_TOLERANCE, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report.")
def verify_cmd(target: str, all_options: bool, shapes: ShapeFixes, seed: int, tolerance: float,
               as_json: bool) -> None:
    """Check that split execution equals the unsplit model.

    TARGET is a bundle directory (runs it on random inputs), or a model file with --all-options.
    Exits non-zero if anything differs by more than --tolerance.
    """
    from partitioner.verify import verify_bundle, verify_options

    path = Path(target)
    with _user_errors():
        if path.is_dir():
            if shapes:
                raise click.UsageError("--dim and --input-shape are for a MODEL; a bundle's input shapes are "
                                       "fixed in its plan")
            report = verify_bundle(path, seeds=(seed, seed + 1), tolerance=tolerance)
            result = {"bundle": str(path), "checked": report.checked, "failed": report.failed,
                      "max_rel_err": report.max_rel_err}
            if report.error:
                result["error"] = report.error
        else:
            if not all_options:
                raise click.UsageError("verify MODEL needs --all-options (or give a bundle directory)")
            lg = _load(target, shapes)
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=_err, transient=True) as bar:
                task = bar.add_task("verifying", total=None)

                def tick(done: int, total: int, label: str) -> None:
                    bar.update(task, completed=done, total=total, description=label)

                report, results = verify_options(lg, seed=seed, tolerance=tolerance, progress=tick)
            result = {"model": lg.name, "units": len(lg.units), "checked": report.checked, "failed": report.failed,
                      "max_rel_err": report.max_rel_err,
                      "not_admissible": sum(1 for r in results if r.rel_err is None),
                      "checks": [r.as_dict() for r in results if r.rel_err is not None]}
        result["failures"] = report.failures
    if as_json:
        click.echo(json.dumps(result, indent=1))
    else:
        ok = report.ok and report.max_rel_err <= tolerance
        colour = "green" if ok else "red"
        _console.print(f"[{colour}]{'ok' if ok else 'FAILED'}[/]: checked {report.checked}, failed {report.failed}, "
                       f"max relative error {report.max_rel_err:.2e}")
        for f in report.failures[:20]:
            _console.print(f"  [red]failed[/] {f}")
    if not report.ok or report.max_rel_err > tolerance:
        raise SystemExit(1)

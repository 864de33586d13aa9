"""`flatpack bench backends`: per-part latency of onnxruntime vs MXNet on the same parts.

Every part (and epilogue) of a bundle runs on the same seeded random inputs with onnxruntime in this
process and with MXNet 1.9 in the MXNet environment (``python -m bench.backends_mxnet``), each with the
same thread count, warm-up dropped, timed with ``perf_counter``. Reported per part: median and p90 of
both, the ratio MXNet / onnxruntime, and the largest relative difference of the outputs; overall: the
geometric mean of the ratios and the largest difference. Without a BUNDLE it builds the issue's small
VGG-11 (zoo, width/4, 64x64) cut as ``0-3:spatial=2x2,4:channel=4,5:channel=4,6-:none``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import numpy as np

from bench.provenance import git_revision, machine
from functions.plan import Plan
from functions.session import make_session

__all__ = ["backends_cmd", "measure"]

DEFAULT_STAGES = "0-3:spatial=2x2,4:channel=4,5:channel=4,6-:none"
_ROOT = Path(__file__).resolve().parent.parent


def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    if got.shape != want.shape:
        return float("inf")
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    return float(diff.max() / max(1.0, float(np.abs(want).max()))) if want.size else 0.0


def _pct(xs: list[float], p: float) -> float:
    return float(np.percentile(xs, p))


def _small_vgg11(root: Path) -> Path:
    from bench.zoo import build
    from partitioner.export import export_bundle

    model = build("vgg11", width_div=4, input_size=64)
    return export_bundle(model, DEFAULT_STAGES, root / "vgg11-small.bundle")


def _mxnet_env() -> dict[str, str]:
    """MXNet's own settings (``MXNET_ENGINE_TYPE``, ...) pass through to the MXNet side."""
    return {k: v for k, v in os.environ.items() if k.startswith("MXNET_")}


def measure(bundle: Path, *, reps: int = 30, warmup: int = 3, threads: int = 1, seed: int = 0,
            timeout_s: float = 600.0) -> dict[str, Any]:
    """Time every part of ``bundle`` under both backends; see the module docstring."""
    from serving.platform.runtimes import backend_python

    python = backend_python("mxnet")  # BackendEnvError if not set up
    plan = Plan.load(bundle / "plan.json")
    files = sorted({p.file for s in plan.stages for p in s.parts} | {s.epilogue for s in plan.stages if s.epilogue})
    rng = np.random.default_rng(seed)
    inputs: dict[str, np.ndarray] = {}
    specs, ort_rows, ort_out = [], [], []
    for i, rel in enumerate(files):
        sess = make_session(bundle / rel, intra_op_threads=threads)
        names = {}
        for j, inp in enumerate(sess.get_inputs()):
            key = f"p{i}.i{j}"
            shape = [d if isinstance(d, int) else 1 for d in inp.shape]
            inputs[key] = rng.standard_normal(shape).astype(np.float32)
            names[inp.name] = key
        x = {n: inputs[k] for n, k in names.items()}
        out_names = [o.name for o in sess.get_outputs()]
        for _ in range(warmup):
            sess.run(out_names, x)
        times = []
        y: list[np.ndarray] = []
        for _ in range(reps):
            t0 = time.perf_counter()
            y = sess.run(out_names, x)
            times.append(1e3 * (time.perf_counter() - t0))
        ort_rows.append(times)
        ort_out.append(dict(zip(out_names, y, strict=True)))
        specs.append({"file": str(bundle / rel), "inputs": names})
    with tempfile.TemporaryDirectory(prefix="flatpack-bench-backends-") as tmp:
        np.savez(Path(tmp) / "in.npz", **inputs)
        req = {"parts": specs, "inputs": str(Path(tmp) / "in.npz"), "out": str(Path(tmp) / "out.npz"),
               "reps": reps, "warmup": warmup, "threads": threads}
        env = {"PYTHONPATH": str(_ROOT), "OMP_NUM_THREADS": str(threads), "PATH": "/usr/bin:/bin", **_mxnet_env()}
        res = subprocess.run([python, "-m", "bench.backends_mxnet"], input=json.dumps(req), capture_output=True,  # noqa: S603
                             text=True, timeout=timeout_s, env=env, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"the MXNet side failed ({res.returncode}): {res.stderr.strip()[-2000:]}")
        mx = json.loads(res.stdout)
        mx_out = np.load(Path(tmp) / "out.npz")
        rows = []
        for i, rel in enumerate(files):
            m = mx["parts"][i]
            errs = [_rel_err(mx_out[f"p{i}.o{j}"], ort_out[i][name]) for j, name in enumerate(m["outputs"])]
            o50, x50 = _pct(ort_rows[i], 50), _pct(m["times_ms"], 50)
            rows.append({"part": rel, "onnxruntime_p50_ms": round(o50, 4),
                         "onnxruntime_p90_ms": round(_pct(ort_rows[i], 90), 4),
                         "mxnet_p50_ms": round(x50, 4), "mxnet_p90_ms": round(_pct(m["times_ms"], 90), 4),
                         "mxnet_load_ms": round(m["load_ms"], 1), "ratio_mxnet_to_onnxruntime": round(x50 / o50, 3),
                         "max_rel_err": max(errs, default=0.0)})
    ratios = [r["ratio_mxnet_to_onnxruntime"] for r in rows]
    return {
        "benchmark": "backends",
        "bundle": str(bundle),
        "config": {"reps": reps, "warmup": warmup, "threads": threads, "seed": seed},
        "parts": rows,
        "geomean_ratio_mxnet_to_onnxruntime": round(math.exp(sum(math.log(r) for r in ratios) / len(ratios)), 3),
        "sum_p50_ms": {"onnxruntime": round(sum(r["onnxruntime_p50_ms"] for r in rows), 3),
                       "mxnet": round(sum(r["mxnet_p50_ms"] for r in rows), 3)},
        "max_rel_err": max(r["max_rel_err"] for r in rows),
        "mxnet_versions": mx["versions"],
        "machine": machine(),
        "git": git_revision(),
    }


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
    from serving.cli.backend import require_backend

    require_backend("mxnet", bundle=bundle, quiet=as_json)
    with tempfile.TemporaryDirectory(prefix="flatpack-bench-vgg-") as tmp:
        b = bundle or _small_vgg11(Path(tmp))
        try:
            result = measure(b, reps=reps, warmup=warmup, threads=threads)
        except RuntimeError as e:
            raise click.ClickException(str(e)) from e
    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "backends.json").write_text(json.dumps(result, indent=1) + "\n")
    if as_json:
        click.echo(json.dumps(result))
        return
    from rich.table import Table

    from serving.cli.console import console

    t = Table(title=f"per-part latency, {threads} thread(s), median of {reps} (ratio = MXNet / onnxruntime)")
    for c in ("part", "onnxruntime ms", "mxnet ms", "ratio", "max rel err"):
        t.add_column(c, justify="left" if c == "part" else "right")
    for r in result["parts"]:
        t.add_row(r["part"], f"{r['onnxruntime_p50_ms']:.3f}", f"{r['mxnet_p50_ms']:.3f}",
                  f"{r['ratio_mxnet_to_onnxruntime']:.2f}", f"{r['max_rel_err']:.1e}")
    console.print(t)
    sums = result["sum_p50_ms"]
    console.print(f"geometric mean ratio {result['geomean_ratio_mxnet_to_onnxruntime']:.2f}; sum of medians "
                  f"{sums['onnxruntime']:.2f} ms (onnxruntime) vs {sums['mxnet']:.2f} ms (MXNet); largest "
                  f"difference {result['max_rel_err']:.1e}; saved to {dest / 'backends.json'}")

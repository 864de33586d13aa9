"""Per-part latency of onnxruntime vs MXNet on the same parts (``flatpack bench backends``).

Every part (and epilogue) of a bundle runs on the same seeded random inputs with onnxruntime in this
process and with MXNet 1.9 in the MXNet environment (``python -m bench.components.backends_mxnet``), each with the
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
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.provenance import git_revision, machine
from functions.compare import rel_err
from functions.plan import Plan
from functions.session import make_session

__all__ = ["DEFAULT_STAGES", "BackendsResult", "PartTiming", "measure", "small_vgg11"]

DEFAULT_STAGES = "0-3:spatial=2x2,4:channel=4,5:channel=4,6-:none"


def _pct(xs: list[float], p: float) -> float:
    return float(np.percentile(xs, p))


def small_vgg11(root: Path) -> Path:
    """The issue's small VGG-11 (zoo, width / 4, 64 x 64) cut as :data:`DEFAULT_STAGES`, exported under
    ``root``."""
    from partitioner.export import export_bundle
    from zoo import build

    model = build("vgg11", width_div=4, input_size=64)
    return export_bundle(model, DEFAULT_STAGES, root / "vgg11-small.bundle")


def _mxnet_env() -> dict[str, str]:
    """MXNet's own settings (``MXNET_ENGINE_TYPE``, ...) pass through to the MXNet side."""
    return {k: v for k, v in os.environ.items() if k.startswith("MXNET_")}


@dataclass(frozen=True)
class PartTiming:
    """One part (or epilogue) file under both backends: median and p90 (ms), MXNet's load time, the ratio
    of the medians (MXNet / onnxruntime), and the largest relative difference of the outputs."""

    part: str
    onnxruntime_p50_ms: float
    onnxruntime_p90_ms: float
    mxnet_p50_ms: float
    mxnet_p90_ms: float
    mxnet_load_ms: float
    ratio_mxnet_to_onnxruntime: float
    max_rel_err: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BackendsResult:
    """Every part of ``bundle`` timed under both backends, with the run's configuration, the MXNet side's
    versions, the machine and the git revision."""

    bundle: str
    config: Mapping[str, Any]
    parts: tuple[PartTiming, ...]
    mxnet_versions: Mapping[str, str]
    machine: Mapping[str, Any] = field(default_factory=machine)
    git: str = field(default_factory=git_revision)

    @property
    def geomean_ratio(self) -> float:
        ratios = [r.ratio_mxnet_to_onnxruntime for r in self.parts]
        return round(math.exp(sum(math.log(r) for r in ratios) / len(ratios)), 3)

    @property
    def sum_p50_ms(self) -> dict[str, float]:
        return {"onnxruntime": round(sum(r.onnxruntime_p50_ms for r in self.parts), 3),
                "mxnet": round(sum(r.mxnet_p50_ms for r in self.parts), 3)}

    @property
    def max_rel_err(self) -> float:
        return max(r.max_rel_err for r in self.parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "benchmark": "backends", "bundle": self.bundle, "config": dict(self.config),
            "parts": [r.to_json() for r in self.parts],
            "geomean_ratio_mxnet_to_onnxruntime": self.geomean_ratio, "sum_p50_ms": self.sum_p50_ms,
            "max_rel_err": self.max_rel_err, "mxnet_versions": dict(self.mxnet_versions),
            "machine": dict(self.machine), "git": self.git,
        }


def measure(bundle: Path, *, reps: int = 30, warmup: int = 3, threads: int = 1, seed: int = 0,
            timeout_s: float = 600.0) -> BackendsResult:
    """Time every part of ``bundle`` under both backends (see the module docstring). BackendEnvError if the
    MXNet environment is not set up; RuntimeError if its side fails."""
    from serving.platform.runtimes import backend_python, project_pythonpath

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
        feeds = Path(tmp) / "in.npz"
        np.savez(feeds, **inputs)  # type: ignore[arg-type]  # numpy's stub: a ** dict might fill allow_pickle
        req = {"parts": specs, "inputs": str(feeds), "out": str(Path(tmp) / "out.npz"),
               "reps": reps, "warmup": warmup, "threads": threads}
        # only this checkout on the path: the MXNet environment has its own numpy, not this one's packages
        env = {"PYTHONPATH": project_pythonpath({}), "OMP_NUM_THREADS": str(threads), "PATH": "/usr/bin:/bin",
               **_mxnet_env()}
        res = subprocess.run([python, "-m", "bench.components.backends_mxnet"], input=json.dumps(req),  # noqa: S603
                             capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"the MXNet side failed ({res.returncode}): {res.stderr.strip()[-2000:]}")
        mx = json.loads(res.stdout)
        mx_out = np.load(Path(tmp) / "out.npz")
        rows: list[PartTiming] = []
        for i, rel in enumerate(files):
            m = mx["parts"][i]
            errs = [rel_err(mx_out[f"p{i}.o{j}"], ort_out[i][name]) for j, name in enumerate(m["outputs"])]
            o50, x50 = _pct(ort_rows[i], 50), _pct(m["times_ms"], 50)
            rows.append(PartTiming(rel, round(o50, 4), round(_pct(ort_rows[i], 90), 4), round(x50, 4),
                                   round(_pct(m["times_ms"], 90), 4), round(m["load_ms"], 1), round(x50 / o50, 3),
                                   max(errs, default=0.0)))
    return BackendsResult(str(bundle), {"reps": reps, "warmup": warmup, "threads": threads, "seed": seed},
                          tuple(rows), mx["versions"])

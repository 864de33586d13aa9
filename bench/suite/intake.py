"""The intake benchmark: does every model onnxruntime runs load, split, verify and serve exactly?

For each model of the corpus (:mod:`zoo.intake`: zoo models from both torch exporters x {fp32, fp16,
int8 dynamic, int8 QDQ, int8 QOperator}, hand-built graphs, a scikit-learn pipeline) it records whether the
model ``loads``, the split families its units admit (``split_families``; ``unsplit_ops``: the op types only
units admitting none hold), how many split options fail numerical verification (``verify_failed``, from
:func:`partitioner.verify.verify_options`), and whether a bundle that splits the first unit that admits a
family two ways (all of it unsplit where none does) answers exactly as onnxruntime does on the original
file (``serves_exact``). The reference is onnxruntime on the file as shipped, not on flatpack's normalised
copy.

Serving goes where a user's requests go (``served_through``): by default the bundle is deployed on the local
platform, run in a process of its own (a master and a worker per part, each a platform function), and asked
over HTTP through the Open Inference Protocol endpoint in front of it, as ``flatpack deploy`` serves it;
``in-process`` runs the bundle through the master's executor in this process instead (seconds, no platform).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx

__all__ = ["SERVE_MODES", "IntakeResult", "IntakeRow", "corpus", "run_intake"]

log = logging.getLogger(__name__)

#: The zoo models of the corpus, small (they are about intake, not speed): name -> build options. A CNN, a
#: text and a vision transformer, and a U-Net (ConvTranspose and Resize in its decoder).
ZOO_MODELS: dict[str, dict[str, Any]] = {
    "vgg11": {"width_div": 16, "input_size": 32},
    "bert": {"layers": 1, "hidden": 32, "heads": 2, "seq_len": 8, "vocab": 64},
    "vit": {"input_size": 32, "layers": 1, "hidden": 32, "heads": 2},
    "unet": {"width_div": 16, "input_size": 128},  # smaller, its decoder's halos cover the whole image
}
# fp16 outputs are compared at fp16's own resolution
_FP16_TOLERANCE = 1e-2
#: Where a row's bundle is served: the local platform's endpoint over HTTP, or the executor in this process.
SERVE_MODES = ("endpoint", "in-process")


@dataclass
class IntakeRow:
    model: str
    variant: str
    loads: bool
    split_families: list[str]
    verify_failed: int
    serves_exact: bool
    unsplit_ops: list[str] = field(default_factory=list)  # op types found in no unit that admits a family
    units: int = 0
    checked: int = 0
    served_split: str = "none"
    served_through: str = ""
    max_rel_err: float | None = None
    error: str | None = None
    seconds: float = 0.0


@dataclass
class IntakeResult:
    rows: list[IntakeRow] = field(default_factory=list)

    def totals(self) -> dict[str, int]:
        return {
            "rows": len(self.rows),
            "loads": sum(r.loads for r in self.rows),
            "serves_exact": sum(r.serves_exact for r in self.rows),
            "with_split_family": sum(bool(r.split_families) for r in self.rows),
            "verify_failed": sum(r.verify_failed for r in self.rows),
            "checked": sum(r.checked for r in self.rows),
        }

    def to_json(self) -> dict[str, Any]:
        return {"rows": [asdict(r) for r in self.rows], "totals": self.totals()}


@dataclass(frozen=True)
class _Entry:
    model: str
    variant: str
    proto: onnx.ModelProto
    input_shapes: tuple[str, ...] = ()
    dims: tuple[str, ...] = ()


def corpus(models: Sequence[str] = tuple(ZOO_MODELS), variants: Sequence[str] | None = None,
           exporters: Sequence[str] = ("legacy", "dynamo"), helpers: bool = True) -> Iterator[_Entry]:
    """The corpus's models, built as they are listed (a zoo model's variants share its float export)."""
    from zoo import build
    from zoo.intake import VARIANTS, helper_models, make_variant, sklearn_model

    for name in models:
        for exporter in exporters:
            base = build(name, exporter=exporter, **ZOO_MODELS.get(name, {}))
            label = name if exporter == "legacy" else f"{name}-{exporter}"
            for variant in variants or VARIANTS:
                yield _Entry(label, variant, make_variant(base, variant))
    if helpers:
        for h in helper_models():
            yield _Entry(h.name, "fp32", h.model, h.input_shapes, h.dims)
        sk = sklearn_model()
        yield _Entry(sk.name, "fp32", sk.model)


def run_intake(entries: Iterator[_Entry], *, verify: bool = True, serve: str = "endpoint",
               say: Callable[[str], None] | None = None) -> IntakeResult:
    """One row per entry (a failure of any step is recorded in its row, with its cause). ``serve``: one of
    :data:`SERVE_MODES` (``endpoint`` starts the local platform once, for the whole run)."""
    if serve not in SERVE_MODES:
        raise ValueError(f"unknown serve mode {serve!r}; use one of {', '.join(SERVE_MODES)}")
    result = IntakeResult()
    with contextlib.ExitStack() as stack:
        server: _Server = _InProcess() if serve == "in-process" else stack.enter_context(_Endpoint())
        for e in entries:
            t0 = time.perf_counter()
            row = _row(e, verify, server)
            row.seconds = round(time.perf_counter() - t0, 2)
            if say:
                say(f"{e.model} {e.variant}: loads={row.loads} families={row.split_families} "
                    f"verify_failed={row.verify_failed} serves_exact={row.serves_exact}"
                    + (f" ({row.error})" if row.error else ""))
            result.rows.append(row)
    return result


_Answers = list[dict[str, np.ndarray]]


class _Server(Protocol):
    """Serves an exported bundle and answers requests with it (``name``: the row's ``served_through``)."""

    name: str

    def answers(self, bundle: Path, requests: Sequence[Mapping[str, np.ndarray]]) -> _Answers: ...


class _InProcess:
    """The bundle run by the master's executor in this process."""

    name = "in-process"

    def answers(self, bundle: Path, requests: Sequence[Mapping[str, np.ndarray]]) -> _Answers:
        from functions.bundle import Bundle
        from functions.executor import InProcessRunner

        b = Bundle.load(bundle)
        runner = InProcessRunner(b.root)
        return [dict(runner.execute(b.plan, dict(x))) for x in requests]


class _Endpoint:
    """The local platform in a process of its own and the Open Inference Protocol endpoint in front of it (as
    ``flatpack deploy`` hosts them): each bundle is deployed as platform functions, served under its
    deployment's name, asked over HTTP (binary tensors), and removed."""

    name = "endpoint"

    def __init__(self, *, timeout_s: float = 120.0) -> None:
        from serving.api import DataPlane, create_app
        from serving.api.server import AppServer
        from serving.platform.process import PlatformProcess

        self._timeout_s = timeout_s
        self._platform = PlatformProcess(idle_timeout_s=600)
        self._plane = DataPlane()
        self._server = AppServer(create_app(self._plane, token=""))

    def __enter__(self) -> _Endpoint:
        self._platform.start()
        try:
            self._server.start()
        except BaseException:
            self._platform.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._server.stop()
        finally:
            self._platform.stop()

    def answers(self, bundle: Path, requests: Sequence[Mapping[str, np.ndarray]]) -> _Answers:
        from serving.api.client import InferClient
        from serving.deploy.local import PlatformBackend
        from serving.platform.deploy import deploy_bundle, new_deployment_id

        dep = deploy_bundle(self._platform.client, bundle, deployment=new_deployment_id("intake-"))
        try:
            backend = PlatformBackend(dep, self._platform.url, name=dep.id, timeout_s=self._timeout_s)
            try:
                backend.warm_up(requests[0])  # the endpoint answers once its model is ready
            except BaseException:
                backend.close()
                raise
            self._plane.add(backend)  # removing it closes it
            try:
                with InferClient(self._server.url, dep.id, timeout_s=self._timeout_s, token="") as client:
                    return [client.infer(x) for x in requests]
            finally:
                self._plane.remove(dep.id)
        finally:
            dep.remove()


def _row(e: _Entry, verify: bool, server: _Server) -> IntakeRow:
    from partitioner.graph import LayerGraph
    from partitioner.normalize import ShapeFixes
    from partitioner.options import unit_families
    from partitioner.verify import verify_options

    row = IntakeRow(e.model, e.variant, False, [], 0, False)
    try:
        fixes = ShapeFixes.parse(e.input_shapes, e.dims)
        lg = LayerGraph.load(e.proto, fixes.inputs, fixes.dims)
    except Exception as exc:  # noqa: BLE001 - a row records why its model did not load
        row.error = f"load: {type(exc).__name__}: {exc}"
        return row
    row.loads = True
    row.units = len(lg.units)
    families = [unit_families(lg, u.index) for u in lg.units]
    row.split_families = sorted({f for fs in families for f in fs})
    split = {lg.nodes[i].op_type for u, fs in zip(lg.units, families, strict=True) if fs for i in u.nodes}
    row.unsplit_ops = sorted({lg.nodes[i].op_type for u in lg.units for i in u.nodes} - split)
    try:
        if verify:
            report, _ = verify_options(lg, tolerance=_FP16_TOLERANCE if e.variant == "fp16" else 1e-4)
            row.checked, row.verify_failed = report.checked, report.failed
        row.served_through = server.name
        row.serves_exact, row.max_rel_err, row.served_split = _serves_exact(e, lg, families, server)
    except Exception as exc:  # noqa: BLE001 - recorded with its cause; the row does not serve
        row.error = f"{type(exc).__name__}: {exc}"
        log.debug("%s %s: %s", e.model, e.variant, traceback.format_exc())
    return row


def _stages(lg: Any, families: Sequence[Sequence[str]]) -> str:
    """Every unit unsplit, but the first that admits a family, split two ways by it."""
    n = len(lg.units)
    u = next((i for i, fs in enumerate(families) if fs), None)
    if u is None:
        return f"0-{n - 1}:none"
    family = families[u][0]
    split = "spatial=2x1" if family == "spatial" else f"{family}=2"
    specs = [f"0-{u - 1}:none"] if u > 0 else []
    specs.append(f"{u}-{u}:{split}")
    if u < n - 1:
        specs.append(f"{u + 1}-{n - 1}:none")
    return ",".join(specs)


def _serves_exact(e: _Entry, lg: Any, families: Sequence[Sequence[str]], server: _Server
                  ) -> tuple[bool, float, str]:
    """Export a bundle (split where a family exists), serve it, compare its answers with onnxruntime's on the
    original file: the same dtypes, integer outputs equal, float outputs within the tolerance."""
    from functions.compare import rel_err
    from functions.session import make_session
    from partitioner.export import export_bundle
    from partitioner.inputs import random_inputs

    stages = _stages(lg, families)
    tolerance = _FP16_TOLERANCE if e.variant == "fp16" else 1e-4
    with tempfile.TemporaryDirectory(prefix="flatpack-intake-") as tmp:
        src = Path(tmp) / "model.onnx"
        onnx.save_model(e.proto, str(src))
        path = export_bundle(lg, stages, Path(tmp) / "bundle", tolerance=tolerance)
        ref = make_session(src)
        names = [o.name for o in ref.get_outputs()]
        requests = [random_inputs(lg.model, seed) for seed in (0, 1)]
        answers = server.answers(path, requests)
        worst = 0.0
        for inputs, got in zip(requests, answers, strict=True):
            want = dict(zip(names, ref.run(names, inputs), strict=True))
            for n in names:
                w, g = np.asarray(want[n]), np.asarray(got[n])
                if g.dtype != w.dtype:
                    return False, float("inf"), stages
                if w.dtype.kind in "iub":
                    if w.shape != g.shape or not np.array_equal(w, g):
                        return False, float("inf"), stages
                else:
                    worst = max(worst, rel_err(g, w))
    return worst <= tolerance, worst, stages

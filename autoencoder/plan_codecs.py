"""The autoencoders a planner may place (``--compress ae`` with ``--mode mopar``), and the bundle of a plan
that places some.

HyPAD (:func:`partitioner.solvers.mopar.hypad`) asks :class:`PlanCodecs` about each cut of its candidate
plans. The first ask at a cut trains (or fetches from the cache) one autoencoder per ratio there and
measures, on held-out labelled data, how much top-1 accuracy the model loses with it; only those within
``--max-accuracy-drop`` are offered, with their bytes and their encoder's and decoder's times.

The budget is measured, never guessed. A model without labelled data gets no autoencoder, and the reason is
said (:meth:`PlanCodecs.for_model`): its calibration inputs would be synthetic images, and neither their
accuracy (there are no labels) nor the disagreement with the uncompressed model on them (which bounds the
accuracy drop only on the inputs it is measured on, and a random-weight model often predicts one class for
every synthetic image) says what the model loses on the inputs it will serve.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoencoder.bundle import write_coded_bundle
from autoencoder.cache import AutoencoderCache
from autoencoder.compress import SplitCompression, cached_split, conv_split_units, load_model_graph
from autoencoder.config import TrainConfig
from autoencoder.datasets import CalibrationSet, load_calibration, shipped_calibration
from autoencoder.edge import edge_options
from autoencoder.errors import CompressionError
from autoencoder.fidelity import Fidelity, measure_fidelity
from autoencoder.runner import BatchRunner
from autoencoder.spec import DEFAULT_MAX_ACCURACY_DROP, CompressSpec
from partitioner.graph import LayerGraph
from partitioner.perfmodel import CutCodec

__all__ = ["AutoencoderOptions", "PlanCodecs", "export_planned", "with_autoencoders"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AutoencoderOptions:
    """What the user asked for: ``--compress ae[:R]`` (``spec``), ``--max-accuracy-drop`` (a fraction summed
    over the plan's cuts), ``--calibration FILE.npz`` (labelled inputs for a model that ships none), and
    how each autoencoder is trained."""

    spec: CompressSpec
    max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP
    calibration: Path | None = None
    config: TrainConfig = field(default_factory=TrainConfig)


class PlanCodecs:
    """The autoencoders plans of ``lg`` may place (a :data:`partitioner.perfmodel.CutCodecs`): called with a
    cut (the unit before it), the ratios of ``options.spec`` whose accuracy drop on ``calibration``'s
    labelled held-out inputs is within the budget.

    Raises:
        CompressionError: ``calibration`` has no labels.
    """

    def __init__(self, lg: LayerGraph, options: AutoencoderOptions, calibration: CalibrationSet, *,
                 cache: AutoencoderCache | None = None, progress: Callable[[str], None] | None = None) -> None:
        if calibration.test_labels is None:
            raise CompressionError(f"{calibration.name} has no labels (y_test): the accuracy an autoencoder costs "
                                   "cannot be measured")
        self.lg = lg
        self.options = options
        self.calibration = calibration
        self.cache = cache
        self._progress = progress
        self._convs = frozenset(conv_split_units(lg))
        self._ratios: dict[tuple[int, str], float] = {}

    @classmethod
    def for_model(cls, lg: LayerGraph, options: AutoencoderOptions, *, cache: AutoencoderCache | None = None,
                  progress: Callable[[str], None] | None = None) -> tuple[PlanCodecs | None, str]:
        """The codecs for ``lg`` and ""; or None and why there are none (no labelled data, or inputs an image
        autoencoder cannot be calibrated with).

        Raises:
            CompressionError: a ``--calibration`` file that cannot be read or does not fit the model.
        """
        give = "give labelled inputs with --calibration FILE.npz (x_train, x_test, y_test)"
        if options.calibration is not None:
            calib: CalibrationSet | None = load_calibration(options.calibration, lg.model)
        else:
            try:
                calib = shipped_calibration(lg.model)
            except CompressionError as e:
                return None, f"no autoencoder: {e}"
        if calib is None:
            return None, (f"no autoencoder: {lg.name} ships no labelled data, so what an autoencoder costs in accuracy "
                          f"cannot be measured against --max-accuracy-drop (synthetic images have no labels); {give}")
        if calib.test_labels is None:
            return None, (f"no autoencoder: {calib.name} has no labels (y_test), so what an autoencoder costs in "
                          f"accuracy cannot be measured against --max-accuracy-drop; {give}")
        return cls(lg, options, calib, cache=cache, progress=progress), ""

    def __call__(self, after: int) -> tuple[CutCodec, ...]:
        if after not in self._convs:  # a convolutional autoencoder needs a float NCHW tensor
            return ()
        say = self._progress

        def progress(phase: str, done: int, total: int) -> None:
            if say is not None:
                say(f"autoencoders after unit {after}: {phase} {done}/{total}")

        opts = edge_options(self.lg, after, compress=self.options.spec,
                            max_accuracy_drop=self.options.max_accuracy_drop, config=self.options.config,
                            calibration=self.calibration, cache=self.cache, progress=progress)
        tensor = self.lg.units[after].output
        out = []
        for o in opts:
            if o.kind != "ae" or o.requested_ratio is None:
                continue
            label = f"ae:{o.requested_ratio:g}"
            self._ratios[(after, label)] = o.requested_ratio
            out.append(CutCodec(after, tensor, o.bytes_before, int(o.bytes_after), o.encode_ms, o.decode_ms,
                                o.accuracy_drop, label))
        return tuple(out)

    def compressions(self, codecs: Sequence[CutCodec]) -> list[SplitCompression]:
        """The trained autoencoders behind ``codecs`` (offered by this instance), from the cache.

        Raises:
            CompressionError: a codec this instance did not offer, or one no longer in the cache.
        """
        out = []
        for c in codecs:
            ratio = self._ratios.get((c.after, c.label))
            if ratio is None:
                raise CompressionError(f"{c.label} after unit {c.after} was not offered for {self.lg.name}")
            sc = cached_split(self.lg, c.after, ratio, config=self.options.config, calibration=self.calibration,
                              cache=self.cache)
            if sc is None:
                raise CompressionError(f"the autoencoder {c.label} after unit {c.after} is no longer in the cache; "
                                       "plan again")
            out.append(sc)
        return out

    def fidelity(self, compressions: Sequence[SplitCompression]) -> Fidelity:
        """How the model with every one of ``compressions`` inserted fares against the model on the held-out
        labelled inputs (accuracies, agreement, output error)."""
        model = self.lg.model
        for sc in compressions:
            model = sc.compressed_model(model)
        x = {self.calibration.input_name: self.calibration.test}
        out = self.lg.outputs[0]
        full = BatchRunner(self.lg.model, threads=1).run(x, [out])[out]
        coded = BatchRunner(model, threads=1).run(x, [out])[out]
        return measure_fidelity(full, coded, self.calibration.test_labels)

    def export(self, result: Any, request: Any, out: str | Path, *, source: str = "",
               progress: Callable[[str], None] | None = None) -> tuple[Path, Fidelity]:
        """Write ``result`` (a plan of ``self.lg`` placing codecs of this instance) as a verified bundle with
        its autoencoders baked in (:func:`autoencoder.bundle.write_coded_bundle`); returns it and the
        compressed model's fidelity.

        Raises:
            CompressionError: the autoencoders together drop accuracy by more than the budget (each was
                within it, but drops need not add up), or as :meth:`compressions` and ``write_coded_bundle``.
        """
        from partitioner.planner import codecs_of, export_solution

        comps = self.compressions(codecs_of(result))
        fid = self.fidelity(comps)
        budget = self.options.max_accuracy_drop
        if fid.accuracy_drop > budget + 1e-12:
            raise CompressionError(f"the plan's autoencoders together drop accuracy by {fid.accuracy_drop * 100:.2f} "
                                   f"points, more than --max-accuracy-drop {budget * 100:.2f}; raise it or plan "
                                   "without --compress ae")
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as tmp:
            plain = export_solution(self.lg, result, request, Path(tmp) / "plain", source=source, progress=progress)
            if progress is not None:
                progress("baking the autoencoders into the parts and verifying them")
            _, sha = load_model_graph(self.lg)
            write_coded_bundle(plain, self.lg, comps, out, source_sha256=sha, fidelity=fid)
        return out, fid


def with_autoencoders(lg: LayerGraph, request: Any, options: AutoencoderOptions | None, *,
                      progress: Callable[[str], None] | None = None) -> tuple[Any, str]:
    """``request`` (a ``PlanRequest``) with the codecs its plans of ``lg`` may place (:meth:`PlanCodecs.for_model`;
    unchanged without ``options``), and why there are none ("" where there are).

    Raises:
        CompressionError: as :meth:`PlanCodecs.for_model`.
    """
    import dataclasses

    if options is None:
        return request, ""
    codecs, note = PlanCodecs.for_model(lg, options, progress=progress)
    return dataclasses.replace(request, codecs=codecs), note


def export_planned(lg: LayerGraph, result: Any, request: Any, out: str | Path, *, source: str = "",
                   progress: Callable[[str], None] | None = None) -> tuple[Path, Fidelity | None]:
    """Write ``result`` (a solution for ``request``) as a verified bundle: with its autoencoders baked in
    where it places some (:meth:`PlanCodecs.export`), else its parts as cut
    (:func:`partitioner.planner.export_solution`). Returns the bundle and the compressed model's fidelity
    (None without autoencoders)."""
    from partitioner.planner import codecs_of, export_solution

    codecs = request.codecs
    if isinstance(codecs, PlanCodecs) and codecs_of(result):
        return codecs.export(result, request, out, source=source, progress=progress)
    return export_solution(lg, result, request, out, source=source, progress=progress), None

"""The data an autoencoder trains and is scored on ("calibration data", as model compression calls it; not
the platform calibration of :mod:`serving.calibrate`): what the prefix runs on to give the activations an
autoencoder trains on, and the held-out inputs its fidelity is measured on.

Three sources, in order of preference:

* a file the user gives (``.npz`` with ``x_train``, ``x_test`` and optionally ``y_test``);
* the real data of a model that carries it: ``digits-cnn`` from the zoo is scored on exactly the
  scikit-learn digits test split it never saw, training the autoencoder on the train split only;
* synthetic images for random-weight models: smooth random fields plus pixel noise, standardised per
  image, drawn from different seeds for training and held-out sets. Their labels do not exist, so
  fidelity is the top-1 agreement with the uncompressed model and the relative output error.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from autoencoder.errors import CompressionError

__all__ = ["CalibrationSet", "calibration_for", "image_input", "load_calibration", "shipped_calibration",
           "synthetic_images"]

log = logging.getLogger(__name__)

_ZOO_KEY = "flatpack.zoo"  # zoo.ZOO_KEY; read here without importing torch
_SPLIT_SEED_KEY = "flatpack.digits_split_seed"
_SYNTHETIC_TRAIN = 1024
_SYNTHETIC_TEST = 512
_SYNTHETIC_TEST_SEED_OFFSET = 10_000


@dataclass(frozen=True)
class CalibrationSet:
    """Model inputs for training (``train``) and for measuring fidelity (``test``, held out).

    Attributes:
        name: where the inputs come from, for reports.
        input_name: the model input they feed.
        train, test: float32 ``[n, C, H, W]``.
        test_labels: int64 ``[n_test]`` ground truth, when known (accuracy is reported then).
        bounds: the value range of the inputs when it is fixed (``(0, 1)`` for digits), else None;
            augmentation clips to it.
    """

    name: str
    input_name: str
    train: np.ndarray
    test: np.ndarray
    test_labels: np.ndarray | None = None
    bounds: tuple[float, float] | None = None

    @property
    def fingerprint(self) -> str:
        """sha256 over the arrays and their description: part of the autoencoder cache key."""
        h = hashlib.sha256(json.dumps([self.name, self.input_name, self.bounds]).encode())
        for a in (self.train, self.test, self.test_labels):
            if a is not None:
                h.update(str((a.dtype.str, a.shape)).encode())
                h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()


def image_input(model: onnx.ModelProto) -> tuple[str, tuple[int, int, int, int]]:
    """The model's single float image input ``(name, (1, C, H, W))``.

    Raises:
        CompressionError: the model has several inputs, or a non-float or non-4-D one.
    """
    inits = {t.name for t in model.graph.initializer}
    ins = [i for i in model.graph.input if i.name not in inits]
    if len(ins) != 1:
        raise CompressionError(
            f"calibration needs a model with one image input, this one has {[i.name for i in ins]}; "
            "pass calibration data (an .npz with x_train/x_test) for other models"
        )
    tt = ins[0].type.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in tt.shape.dim)
    dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
    if len(dims) != 4 or not np.issubdtype(dtype, np.floating):
        raise CompressionError(
            f"model input {ins[0].name!r} is {np.dtype(dtype).name}{list(dims)}, not a float NCHW image; "
            "pass calibration data (an .npz with x_train/x_test) for other models"
        )
    return ins[0].name, (1, int(dims[1]), int(dims[2]), int(dims[3]))


def synthetic_images(n: int, chw: tuple[int, int, int], seed: int) -> np.ndarray:
    """``n`` standardised images ``[n, C, H, W]``: smooth random fields (noise at a quarter of the
    resolution, upsampled bilinearly) plus a quarter of white noise."""
    import torch
    import torch.nn.functional as F

    c, h, w = chw
    rng = np.random.default_rng(seed)
    low = rng.standard_normal((n, c, max(2, h // 4), max(2, w // 4)), dtype=np.float32)
    smooth = F.interpolate(torch.from_numpy(low), size=(h, w), mode="bilinear", align_corners=False).numpy()
    x = smooth + 0.25 * rng.standard_normal((n, c, h, w), dtype=np.float32)
    x -= x.mean(axis=(1, 2, 3), keepdims=True)
    x /= x.std(axis=(1, 2, 3), keepdims=True) + 1e-6
    return x.astype(np.float32)


def _zoo_info(model: onnx.ModelProto) -> dict | None:
    for p in model.metadata_props:
        if p.key == _ZOO_KEY:
            try:
                return json.loads(p.value)
            except json.JSONDecodeError:
                return None
    return None


def shipped_calibration(model: onnx.ModelProto) -> CalibrationSet | None:
    """The labelled data a model ships with (``digits-cnn``: the digits split it was trained on, scored on the
    part it never saw), or None.

    Raises:
        CompressionError: the model does not take one float NCHW image (see :func:`image_input`).
    """
    name, shape = image_input(model)
    info = _zoo_info(model)
    if info is None or info.get("family") != "digits":
        return None
    from zoo import load_digits_split

    meta = {p.key: p.value for p in model.metadata_props}
    split_seed = int(meta.get(_SPLIT_SEED_KEY, info.get("options", {}).get("seed", 0)))
    x_train, _, x_test, y_test = load_digits_split(shape[2], split_seed)
    if x_train.shape[1:] != shape[1:]:
        raise CompressionError(f"digits images are {list(x_train.shape[1:])}, the model takes {list(shape)}")
    return CalibrationSet(f"digits (scikit-learn, split seed {split_seed})", name, x_train, x_test, y_test,
                          bounds=(0.0, 1.0))


def calibration_for(model: onnx.ModelProto, *, seed: int = 0, synthetic_train: int = _SYNTHETIC_TRAIN,
                    synthetic_test: int = _SYNTHETIC_TEST) -> CalibrationSet:
    """The calibration set a model calls for: what it ships with (:func:`shipped_calibration`), synthetic
    images otherwise.

    Raises:
        CompressionError: the model does not take one float NCHW image (see :func:`image_input`).
    """
    shipped = shipped_calibration(model)
    if shipped is not None:
        return shipped
    name, shape = image_input(model)
    chw = shape[1:]
    return CalibrationSet(
        f"synthetic images (seed {seed})", name,
        synthetic_images(synthetic_train, chw, seed),
        synthetic_images(synthetic_test, chw, seed + _SYNTHETIC_TEST_SEED_OFFSET),
    )


def load_calibration(path: str | Path, model: onnx.ModelProto) -> CalibrationSet:
    """A calibration set from an ``.npz`` file: ``x_train`` and ``x_test`` (``[n, C, H, W]``, matching the
    model input) and optionally ``y_test`` (int labels) and ``bounds`` (``[lo, hi]``). No pickles.

    Raises:
        CompressionError: a missing file or array, or arrays that do not fit the model.
    """
    name, shape = image_input(model)
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise CompressionError(f"cannot read calibration data {path}: {e}") from e
    missing = [k for k in ("x_train", "x_test") if k not in arrays]
    if missing:
        raise CompressionError(f"{path} lacks {missing}; it has {sorted(arrays)}")
    x_train, x_test = (arrays[k].astype(np.float32) for k in ("x_train", "x_test"))
    for k, a in (("x_train", x_train), ("x_test", x_test)):
        if a.ndim != 4 or a.shape[1:] != shape[1:] or len(a) == 0:
            raise CompressionError(f"{path}: {k} is {list(a.shape)}, the model input {name!r} needs [n, "
                                   f"{', '.join(map(str, shape[1:]))}]")
    labels = arrays.get("y_test")
    if labels is not None and labels.shape != (len(x_test),):
        raise CompressionError(f"{path}: y_test has shape {list(labels.shape)}, expected [{len(x_test)}]")
    bounds = arrays.get("bounds")
    return CalibrationSet(
        f"file {path.name}", name, x_train, x_test, None if labels is None else labels.astype(np.int64),
        None if bounds is None else (float(bounds[0]), float(bounds[1])),
    )

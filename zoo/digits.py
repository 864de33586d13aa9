"""``digits-cnn``: a small CNN trained at build time on scikit-learn's bundled digits data set.

The data (1797 8x8 grey-scale digits, shipped inside scikit-learn, never downloaded) is scaled to [0, 1],
upsampled bilinearly to ``S x S`` and split 70/30 (stratified, seeded). The CNN
``conv32-conv32-pool-conv64-pool-conv64-pool-FC128-FC10`` is trained with Adam for a fixed number of
epochs on a fixed number of threads, so a seed gives the same weights on every run, in a few seconds on
two cores. The held-out accuracy is measured, not assumed, and stored in the model's metadata; the same
split is available from :func:`load_digits_split` so later work (e.g. evaluating autoencoder compression
at split points) can score on exactly the images the model never saw.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from zoo.errors import ZooError
from zoo.options import BuildOptions, scaled
from zoo.torch_model import TorchModel
from zoo.weights import seeded

__all__ = [
    "ACCURACY_KEY",
    "DIGITS_DEFAULTS",
    "SPLIT_SEED_KEY",
    "DigitsSplit",
    "load_digits_split",
    "make_digits_cnn",
]

_log = logging.getLogger(__name__)

DIGITS_DEFAULTS: dict[str, int] = {"input_size": 32}

#: metadata_props key holding the held-out accuracy (a decimal string, e.g. "0.9796").
ACCURACY_KEY = "flatpack.test_accuracy"
#: metadata_props key holding the seed of the train/test split.
SPLIT_SEED_KEY = "flatpack.digits_split_seed"

#: (x_train, y_train, x_test, y_test): float32 NCHW in [0, 1] and int64 labels 0..9.
DigitsSplit = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]

_TEST_FRACTION = 0.3
_EPOCHS = 8
_BATCH = 32
_LR = 2e-3
_TRAIN_THREADS = 2
_MIN_INPUT = 8  # three 2x2 pools


def load_digits_split(input_size: int = 32, seed: int = 0) -> DigitsSplit:
    """The digits data, upsampled to ``input_size``, split 70/30 (stratified by label, seeded).

    Args:
        input_size: side ``S`` of the square images; the 8x8 originals are upsampled bilinearly
            (``align_corners=False``). Must be at least 8.
        seed: the split's ``random_state``; the same seed gives the same split on every machine.

    Returns:
        ``(x_train, y_train, x_test, y_test)``: ``x_*`` float32 ``[n, 1, S, S]`` in [0, 1], ``y_*`` int64
        ``[n]``. 1257 training and 540 test images.

    Raises:
        ZooError: ``input_size`` below 8.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if isinstance(input_size, bool) or not isinstance(input_size, int) or input_size < _MIN_INPUT:
        raise ZooError(f"digits input_size must be an integer >= {_MIN_INPUT}, got {input_size!r}")
    data = load_digits()
    images = torch.from_numpy(data.images.astype(np.float32) / 16.0).unsqueeze(1)
    if input_size != images.shape[-1]:
        images = F.interpolate(images, size=(input_size, input_size), mode="bilinear", align_corners=False)
    x = images.clamp_(0.0, 1.0).numpy()
    y = data.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=_TEST_FRACTION, stratify=y, random_state=seed)
    return (
        np.ascontiguousarray(x_train),
        np.ascontiguousarray(y_train),
        np.ascontiguousarray(x_test),
        np.ascontiguousarray(y_test),
    )


class _DigitsCNN(nn.Module):
    def __init__(self, input_size: int, width_div: int) -> None:
        super().__init__()
        c1, c2, fc = scaled(32, width_div), scaled(64, width_div), scaled(128, width_div)
        self.features = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(c1, c1, 3, padding=1), nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(c2, c2, 3, padding=1), nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )  # fmt: skip
        side = input_size // 8
        self.classifier = nn.Sequential(nn.Linear(c2 * side * side, fc), nn.ReLU(inplace=True), nn.Linear(fc, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    # A fixed thread count makes the float reductions, and so the trained weights, reproducible.
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _train(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    optimizer = torch.optim.Adam(module.parameters(), lr=_LR)
    steps = _EPOCHS * -(-len(x) // _BATCH)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    module.train()
    for epoch in range(_EPOCHS):
        order = torch.randperm(len(x))
        total = 0.0
        for start in range(0, len(x), _BATCH):
            idx = order[start : start + _BATCH]
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(module(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
            schedule.step()
            total += loss.item() * len(idx)
        _log.debug("digits-cnn epoch %d: train loss %.4f", epoch + 1, total / len(x))
    module.eval()


@torch.no_grad()
def _accuracy(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return float((module(x).argmax(dim=1) == y).float().mean())


def make_digits_cnn(name: str, options: BuildOptions) -> TorchModel:
    """Train the digits CNN; input ``[1, 1, S, S]`` float32 in [0, 1], output ``[1, 10]`` logits.

    ``seed`` seeds the split, the initial weights and the batch order. The returned metadata carries the
    held-out accuracy (:data:`ACCURACY_KEY`) and the split seed (:data:`SPLIT_SEED_KEY`).

    Raises:
        ZooError: an input size below 8.
    """
    size = options.size("input_size")
    if size < _MIN_INPUT:
        raise ZooError(f"{name} needs an input size of at least {_MIN_INPUT} (three 2x2 pools), got {size}")
    x_train, y_train, x_test, y_test = load_digits_split(size, options.seed)
    with seeded(options.seed), _threads(_TRAIN_THREADS):
        module = _DigitsCNN(size, options.width_div)
        _train(module, torch.from_numpy(x_train), torch.from_numpy(y_train))
        accuracy = _accuracy(module, torch.from_numpy(x_test), torch.from_numpy(y_test))
    _log.info("%s: test accuracy %.4f on %d held-out images", name, accuracy, len(y_test))
    example = torch.from_numpy(x_test[:1].copy())
    return TorchModel(
        module=module,
        example_inputs=(example,),
        metadata=((ACCURACY_KEY, f"{accuracy:.4f}"), (SPLIT_SEED_KEY, str(options.seed))),
    )

"""Training one split-point autoencoder on activations collected at the split (torch, CPU)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from autoencoder.config import TrainConfig
from autoencoder.design import AEDesign

__all__ = ["ProgressFn", "TrainedWeights", "train_weights"]

log = logging.getLogger(__name__)

#: progress(epochs_done, epochs_total, train_loss)
ProgressFn = Callable[[int, int, float], None]


@dataclass(frozen=True)
class TrainedWeights:
    """The trained pair with the activation scale folded in, ready to write as ONNX.

    ``encoder_weight`` is ``[C_e, C, k, k]``; ``decoder_weight`` is ``[C, C_e, k, k]`` for a stride-1 Conv
    and ``[C_e, C, k, k]`` for a stride-2 ConvTranspose (the layouts ONNX uses for each op).
    """

    encoder_weight: np.ndarray
    encoder_bias: np.ndarray
    decoder_weight: np.ndarray
    decoder_bias: np.ndarray
    train_loss: float  # final epoch's mean MSE on activations / scale
    seconds: float


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    # A fixed thread count makes the float reductions, and so the trained weights, reproducible.
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_weights(
    design: AEDesign, activations: np.ndarray, *, config: TrainConfig | None = None,
    progress: ProgressFn | None = None,
) -> TrainedWeights:
    """Train the pair to reconstruct ``activations`` (``[n, C, H, W]`` float32) under MSE.

    Adam with a one-cycle learning rate; the batch order and initial weights come from ``config.seed``
    (``config`` defaults to :class:`TrainConfig`). Loss is measured on ``activations / scale`` (scale =
    their RMS), and the scale is folded into the returned weights: encoder weights divided by it, decoder
    weights and bias multiplied.
    """
    import torch
    import torch.nn.functional as F

    from autoencoder.network import SplitAutoencoder

    config = config or TrainConfig()

    start = time.perf_counter()
    if activations.ndim != 4 or activations.shape[1:] != (design.channels, design.height, design.width):
        raise ValueError(f"activations of shape {activations.shape} do not match the design {design}")
    scale = float(np.sqrt(np.mean(np.square(activations, dtype=np.float64)))) or 1.0
    data = torch.from_numpy(np.ascontiguousarray(activations, dtype=np.float32) / np.float32(scale))
    n = len(data)
    steps_per_epoch = -(-n // config.batch_size)
    with _torch_threads(config.threads):
        torch.manual_seed(config.seed)
        gen = torch.Generator().manual_seed(config.seed)
        net = SplitAutoencoder(design)
        opt = torch.optim.Adam(net.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=config.lr, total_steps=config.epochs * steps_per_epoch,
                                                    pct_start=0.1)
        net.train()
        epoch_loss = float("nan")
        for epoch in range(config.epochs):
            order = torch.randperm(n, generator=gen)
            total = 0.0
            for s in range(0, n, config.batch_size):
                batch = data[order[s:s + config.batch_size]]
                opt.zero_grad(set_to_none=True)
                loss = F.mse_loss(net(batch), batch)
                loss.backward()
                opt.step()
                sched.step()
                total += loss.item() * len(batch)
            epoch_loss = total / n
            log.debug("autoencoder epoch %d/%d: loss %.5f", epoch + 1, config.epochs, epoch_loss)
            if progress is not None:
                progress(epoch + 1, config.epochs, epoch_loss)
        net.eval()
        enc_bias, dec_bias = net.encoder.bias, net.decoder.bias
        if enc_bias is None or dec_bias is None:
            raise RuntimeError("SplitAutoencoder's convolutions were built without a bias")
        ew = net.encoder.weight.detach().numpy() / scale
        eb = enc_bias.detach().numpy().copy()
        dw = net.decoder.weight.detach().numpy() * scale
        db = dec_bias.detach().numpy() * scale
    f32 = np.float32
    return TrainedWeights(ew.astype(f32), eb.astype(f32), dw.astype(f32), db.astype(f32), epoch_loss,
                          time.perf_counter() - start)

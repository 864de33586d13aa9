"""Data augmentation for calibration images (MOPAR section II-D: "image skewing and cropping").

Each augmented copy of an image is a random affine warp (shift as a crop would, zoom, small rotation,
shear as a skew) followed by Gaussian noise. Warps are drawn per image from a seeded generator, so a seed
gives the same copies on every machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Augmentation", "augment_images"]


@dataclass(frozen=True)
class Augmentation:
    """Ranges of the random warp and noise.

    Parameters
    ----------
    shift: largest translation, as a fraction of the image side (a random crop, re-padded).
    zoom: largest relative scale change (crop-and-resize).
    rotate_deg: largest rotation.
    shear: largest shear factor (the skew).
    noise: Gaussian noise standard deviation, relative to the batch's standard deviation.
    """

    shift: float = 0.1
    zoom: float = 0.1
    rotate_deg: float = 10.0
    shear: float = 0.15
    noise: float = 0.05


def augment_images(
    images: np.ndarray, copies: int, *, seed: int = 0, bounds: tuple[float, float] | None = None,
    augmentation: Augmentation = Augmentation(),
) -> np.ndarray:
    """``copies`` augmented versions of every image in ``images`` (``[n, C, H, W]`` float32).

    Returns ``[copies * n, C, H, W]`` (copy-major). ``bounds``: clip the results to this value range
    (e.g. ``(0, 1)`` for images in [0, 1]); pixels warped in from outside the image are zero when bounds
    are given (a dark background) and mirrored otherwise.
    """
    import torch
    import torch.nn.functional as F

    if copies <= 0 or len(images) == 0:
        return np.empty((0, *images.shape[1:]), dtype=np.float32)
    a = augmentation
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32)).repeat(copies, 1, 1, 1)
    n = len(x)
    angle = np.deg2rad(rng.uniform(-a.rotate_deg, a.rotate_deg, n))
    scale = 1.0 + rng.uniform(-a.zoom, a.zoom, n)
    shear = rng.uniform(-a.shear, a.shear, n)
    tx, ty = rng.uniform(-2 * a.shift, 2 * a.shift, (2, n))  # affine_grid coordinates span [-1, 1]
    cos, sin = np.cos(angle) / scale, np.sin(angle) / scale
    theta = np.stack([np.stack([cos, -sin + shear, tx], 1), np.stack([sin, cos, ty], 1)], 1).astype(np.float32)
    grid = F.affine_grid(torch.from_numpy(theta), list(x.shape), align_corners=False)
    warped = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros" if bounds else "reflection",
                           align_corners=False)
    out = warped.numpy()
    std = float(images.std()) or 1.0
    out = out + rng.standard_normal(out.shape, dtype=np.float32) * np.float32(a.noise * std)
    if bounds is not None:
        out = np.clip(out, bounds[0], bounds[1])
    return out.astype(np.float32, copy=False)

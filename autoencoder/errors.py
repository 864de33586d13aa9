"""Exceptions of the autoencoder package. Each subclasses the builtin it refines."""

from __future__ import annotations

__all__ = ["CompressionError"]


class CompressionError(ValueError):
    """A split point, ratio or calibration set that compression cannot work with (named in the message)."""

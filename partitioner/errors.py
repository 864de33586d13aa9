"""Exceptions of the offline side. Each subclasses the builtin it refines."""

from __future__ import annotations

__all__ = ["ExportError", "ModelError", "NotSplittable", "SpecError", "UnsupportedByBackend"]


class ModelError(ValueError):
    """The model file is malformed, unsupported, or lacks information flatpack needs (e.g. shapes)."""


class SpecError(ValueError):
    """A user-written stage specification (``--stages``) is malformed or does not fit the model."""


class NotSplittable(ValueError):  # noqa: N818 - reads better at the raise site than NotSplittableError
    """A group of units cannot be split with the requested family/grid (the option is not admissible)."""


class ExportError(RuntimeError):
    """Export refused: the parts do not reproduce the model's outputs."""


class UnsupportedByBackend(ExportError):
    """Export refused: a part uses an op (or option) the chosen part-execution backend cannot run."""

"""Exceptions raised by the model zoo."""

from __future__ import annotations

__all__ = ["ZooError", "ZooExportError"]


class ZooError(ValueError):
    """A model name or build option the zoo cannot honour.

    The message names the offending value and lists what is valid instead, so the CLI can show it as is.
    """


class ZooExportError(RuntimeError):
    """A torch -> ONNX export failed for a valid name and valid options.

    This is not the caller's fault; the message names the model, exporter and opset and suggests the other
    exporter. The exporter's own exception is chained as ``__cause__``.
    """

"""AWS Lambda entry point of a flatpack function package: ``flatpack_entry.handler``.

The deployers copy this file to the package root, beside the function runtime (``functions/``), the
vendored wheels (``vendor/``) and the bundle (``bundle/``). It only puts the package's own copies first on
``sys.path``; the handler is :func:`functions.handlers.aws_lambda.handler`.
"""

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# the package's own copies first: the vendored wheels, then the function runtime beside this file
for _p in (_HERE, _HERE / "vendor"):
    if _p.is_dir() and str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from functions.handlers.aws_lambda import handler, runtime  # noqa: E402 - the package must be on sys.path first

__all__ = ["handler", "runtime"]

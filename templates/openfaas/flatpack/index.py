"""The flatpack OpenFaaS template's process (``fprocess``): the function server of-watchdog forwards to.

The handler folder (``function/``: the function runtime and the bundle) goes first on ``sys.path``
(``FLATPACK_FUNCTION_DIR`` overrides where it is); the server is :func:`functions.handlers.openfaas.main`.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, os.environ.get("FLATPACK_FUNCTION_DIR") or str(Path(__file__).resolve().parent / "function"))

from functions.handlers.openfaas import main  # noqa: E402 - the handler folder must be on sys.path first

if __name__ == "__main__":
    main()

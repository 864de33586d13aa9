"""Files rendered or copied per deployment: the cloud entry point (``flatpack_entry.py``, copied beside the
``functions`` package into every Lambda package and OpenFaaS image) and the OpenFaaS function template
(``openfaas/flatpack``)."""

from pathlib import Path

__all__ = ["ENTRY", "OPENFAAS_TEMPLATE", "TEMPLATES_DIR"]

TEMPLATES_DIR = Path(__file__).resolve().parent
ENTRY = TEMPLATES_DIR / "flatpack_entry.py"
OPENFAAS_TEMPLATE = TEMPLATES_DIR / "openfaas" / "flatpack"

"""Files rendered or copied per deployment: the cloud entry point (``flatpack_entry.py``, copied beside the
``functions`` package into every Lambda package and OpenFaaS image) and the OpenFaaS function template
(``openfaas/flatpack``), and the Lambda container image of the MXNet backend (``lambda/Dockerfile``)."""

from pathlib import Path

__all__ = ["ENTRY", "LAMBDA_IMAGE_DOCKERFILE", "OPENFAAS_TEMPLATE", "TEMPLATES_DIR"]

TEMPLATES_DIR = Path(__file__).resolve().parent
ENTRY = TEMPLATES_DIR / "flatpack_entry.py"
OPENFAAS_TEMPLATE = TEMPLATES_DIR / "openfaas" / "flatpack"
LAMBDA_IMAGE_DOCKERFILE = TEMPLATES_DIR / "lambda" / "Dockerfile"

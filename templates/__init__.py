"""The thin files a target needs besides the function runtime (``functions/``, whose handlers do the work):
the Lambda entry shim (``flatpack_entry.py``, copied to the root of every Lambda package), the OpenFaaS
function template (``openfaas/flatpack``: of-watchdog + ``index.py``, which starts
``functions.handlers.openfaas``), the Lambda container image of the MXNet backend (``lambda/Dockerfile``)
and the Serverless Framework plugin that uploads bundle files too large for a package
(``lambda/flatpack_bundle_upload.js``)."""

from pathlib import Path

__all__ = ["ENTRY", "LAMBDA_BUNDLE_UPLOAD_PLUGIN", "LAMBDA_IMAGE_DOCKERFILE", "OPENFAAS_TEMPLATE", "TEMPLATES_DIR"]

TEMPLATES_DIR = Path(__file__).resolve().parent
ENTRY = TEMPLATES_DIR / "flatpack_entry.py"
OPENFAAS_TEMPLATE = TEMPLATES_DIR / "openfaas" / "flatpack"
LAMBDA_IMAGE_DOCKERFILE = TEMPLATES_DIR / "lambda" / "Dockerfile"
LAMBDA_BUNDLE_UPLOAD_PLUGIN = TEMPLATES_DIR / "lambda" / "flatpack_bundle_upload.js"

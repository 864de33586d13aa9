"""The inference endpoint: Open Inference Protocol v2 over HTTP in front of a model's master."""

from serving.api.app import create_app
from serving.api.dataplane import Backend, DataPlane, InProcessBackend, ModelInfo

__all__ = ["Backend", "DataPlane", "InProcessBackend", "ModelInfo", "create_app"]

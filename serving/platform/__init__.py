"""The local serverless platform: functions as OS processes with AWS Lambda's semantics, on one machine.

Each instance serves one request at a time; instances start on demand up to a per-function concurrency
limit (cold starts, counted) and are reaped when idle; memory limits are enforced by killing the
instance (reported as out-of-memory); CPU follows memory through the platform profile; a billing meter
counts invocations, billed GB-seconds, cold starts and errors. The HTTP API speaks AWS Lambda's Invoke
shape and OpenFaaS's gateway shape. Binds 127.0.0.1 unless told otherwise.
"""

from serving.platform.client import PlatformClient, PlatformUnavailable
from serving.platform.config import PlatformConfig
from serving.platform.server import LocalPlatform, serve
from serving.platform.spec import FunctionSpec

__all__ = ["FunctionSpec", "LocalPlatform", "PlatformClient", "PlatformConfig", "PlatformUnavailable", "serve"]

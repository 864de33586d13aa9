"""A function's configuration, read from ``FLATPACK_*`` environment variables.

The deployer (or the local platform) sets these on every function; one reader here turns them into a
typed, frozen :class:`FunctionConfig` and raises ``ValueError`` naming the variable when one is wrong.
Units are in the names (``_MS``, ``_MB``, ``_BYTES``, ``_S``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from functions import settings

if TYPE_CHECKING:  # the codec imports numpy; this module stays import-free
    from functions.codec import Compression

__all__ = ["TRANSPORTS", "FunctionConfig"]

TRANSPORTS = ("inline", "shm", "redis", "s3")
INVOKERS = ("local", "lambda", "openfaas")
COMPRESSIONS = ("none", "zstd", "lz4")
BACKENDS = ("onnxruntime", "mxnet")  # functions.backends.BACKENDS, kept import-free here


@dataclass(frozen=True)
class FunctionConfig:
    """Everything a function needs besides its bundle.

    Parameters
    ----------
    bundle_dir: the bundle (plan.json, parts/) this function serves.
    deployment: deployment id; part of every transport key and of the deployed function names.
    function: this function's name in the plan (``plan.functions[i].name``).
    transport: how tensors move: ``inline`` (inside the invocation, Gillis's way), ``shm`` (tmpfs files,
        MOPAR's way, same host only), ``redis`` or ``s3``.
    fallback_transport: where ``inline`` puts tensors that would take a message over
        ``payload_limit_bytes`` (``shm`` on one host, ``redis``/``s3`` in the cloud).
    payload_limit_bytes: the platform's synchronous invoke payload limit (6 MB on AWS Lambda).
    inline_max_bytes: with a reference transport, tensors up to this size still travel inline
        (0: every tensor goes through the transport).
    compression: codec compression for tensors this function sends (``none``, ``zstd``, ``lz4``).
    key_ttl_s: TTL of stored tensors, the backstop behind delete-after-read.
    redis_url, shm_dir, s3_bucket, s3_endpoint_url, aws_region: where the transports store tensors.
    invoker: how the master invokes workers: ``local`` (the local platform's Lambda-shaped HTTP API),
        ``lambda`` (boto3), ``openfaas`` (HTTP to the gateway).
    invoke_url: the local platform's or the OpenFaaS gateway's base URL; the Lambda endpoint override.
    function_prefix: deployed function name = prefix + plan function name.
    invoke_qualifier: the version or alias the master invokes its workers at (``live`` on Lambda, so a
        worker's unpublished ``$LATEST`` is never what serves); empty: the unqualified function.
    invoke_timeout_ms: deadline of one invocation attempt (the request's deadline caps it).
    max_retries: further attempts after a retryable failure (crash, timeout, transport hiccup).
    hedge_percentile: re-invoke a part still running past this percentile of its recent durations, in
        the stages whose parts are cheap to duplicate (:func:`functions.master.cheap_to_duplicate`: split
        stages of small parts); on by default at p95 (None: no hedging); ``hedge_min_samples`` durations
        are needed first.
    intra_op_threads: onnxruntime threads, from the function's vCPU share (0: onnxruntime decides).
    memory_mb: the function's memory size (informational inside the function; the platform enforces it).
    backend: what runs the parts: ``onnxruntime`` (default) or ``mxnet`` (MXNet 1.9, in its own
        environment; see :mod:`functions.backends`).
    model_name: the model's name on the master's HTTP routes (``/v2/models/<name>``; empty: the plan's).
    bundle_s3_uri: ``s3://bucket/prefix`` holding the bundle files of a function whose parts did not fit
        its package: fetched to local disk at cold start and checked against the manifest (empty: the
        bundle is in ``bundle_dir``).
    """

    bundle_dir: Path
    deployment: str
    function: str
    transport: str = "inline"
    fallback_transport: str | None = "shm"
    payload_limit_bytes: int = 6 * 1024 * 1024
    inline_max_bytes: int = 0
    compression: Compression = "none"
    key_ttl_s: int = 600
    redis_url: str = settings.DEFAULT_REDIS_URL
    shm_dir: Path = Path("/dev/shm/flatpack")  # noqa: S108 - tmpfs shared between functions is the point
    s3_bucket: str = "flatpack-tensors"
    s3_endpoint_url: str | None = None
    aws_region: str = "us-east-1"
    invoker: str = "local"
    invoke_url: str | None = None
    function_prefix: str = ""
    invoke_qualifier: str = ""
    invoke_timeout_ms: int = 60_000
    max_retries: int = 2
    hedge_percentile: float | None = 95.0
    hedge_min_samples: int = 20
    intra_op_threads: int = 0
    memory_mb: int | None = None
    backend: str = "onnxruntime"
    model_name: str = ""
    bundle_s3_uri: str = ""

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"FLATPACK_TRANSPORT={self.transport!r} is not one of {TRANSPORTS}")
        if self.fallback_transport is not None and self.fallback_transport not in TRANSPORTS[1:]:
            raise ValueError(
                f"FLATPACK_FALLBACK_TRANSPORT={self.fallback_transport!r} must be a reference transport "
                f"{TRANSPORTS[1:]} or empty"
            )
        if self.invoker not in INVOKERS:
            raise ValueError(f"FLATPACK_INVOKER={self.invoker!r} is not one of {INVOKERS}")
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"FLATPACK_COMPRESSION={self.compression!r} is not one of {COMPRESSIONS}")
        if self.backend not in BACKENDS:
            raise ValueError(f"FLATPACK_BACKEND={self.backend!r} is not one of {BACKENDS}")
        if self.hedge_percentile is not None and not 0 < self.hedge_percentile < 100:
            raise ValueError(f"FLATPACK_HEDGE_PERCENTILE={self.hedge_percentile} must be in (0, 100)")
        if self.bundle_s3_uri and not self.bundle_s3_uri.startswith("s3://"):
            raise ValueError(f"FLATPACK_BUNDLE_S3_URI={self.bundle_s3_uri!r} is not an s3://bucket/prefix URI")
        if self.max_retries < 0 or self.invoke_timeout_ms <= 0 or self.payload_limit_bytes <= 0:
            raise ValueError("FLATPACK_MAX_RETRIES must be >= 0, FLATPACK_INVOKE_TIMEOUT_MS and "
                             "FLATPACK_PAYLOAD_LIMIT_BYTES > 0")

    def deployed_name(self, function: str) -> str:
        return f"{self.function_prefix}{function}"

    def invoke_name(self, function: str) -> str:
        """What the master invokes for plan function ``function``: its deployed name, qualified."""
        name = self.deployed_name(function)
        return f"{name}:{self.invoke_qualifier}" if self.invoke_qualifier else name

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FunctionConfig:
        """Read ``FLATPACK_<FIELD>`` for every field; bundle dir, deployment and function are required."""
        env = os.environ if environ is None else environ
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            var = f"FLATPACK_{f.name.upper()}"
            shared = _SHARED.get(var)
            if shared is not None:  # also a CLI setting: read by its one reader, with its one behaviour
                value = shared(env)
                if value is not None:
                    kwargs[f.name] = value
                continue
            raw = env.get(var)
            if raw is None:
                if f.name in ("bundle_dir", "deployment", "function"):
                    raise ValueError(f"{var} is not set; the deployer sets it on every function")
                continue
            kwargs[f.name] = _parse(var, f.name, raw)
        return cls(**kwargs)

    def to_env(self) -> dict[str, str]:
        """The environment that :meth:`from_env` reads back into this config."""
        out: dict[str, str] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f"FLATPACK_{f.name.upper()}"] = "" if v is None else str(v)
        return out


# Variables a function shares with the CLI (the deployer passes the user's value on).
_SHARED: dict[str, Callable[[Mapping[str, str]], str | None]] = {
    settings.REDIS_URL: settings.redis_url,
    settings.S3_BUCKET: settings.s3_bucket,
}

_INTS = {
    "payload_limit_bytes", "inline_max_bytes", "key_ttl_s", "invoke_timeout_ms", "max_retries",
    "hedge_min_samples", "intra_op_threads", "memory_mb",
}
_OPTIONAL = {"fallback_transport", "s3_endpoint_url", "invoke_url", "hedge_percentile", "memory_mb"}


def _parse(var: str, name: str, raw: str) -> Any:
    raw = raw.strip()
    if name in _OPTIONAL and raw == "":
        return None
    try:
        if name in _INTS:
            return int(raw)
        if name == "hedge_percentile":
            return float(raw)
    except ValueError as e:
        raise ValueError(f"{var}={raw!r} is not a number") from e
    if name in ("bundle_dir", "shm_dir"):
        return Path(raw)
    return raw

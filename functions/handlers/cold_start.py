"""How a cloud function instance starts: where its bundle is, then its runtime.

:func:`start_runtime` reads the function's configuration from its environment
(:meth:`functions.config.FunctionConfig.from_env`), makes a relative ``FLATPACK_BUNDLE_DIR`` absolute
against the package root (the directory holding ``functions/``: ``/var/task`` on Lambda, the handler folder
in an OpenFaaS image), fetches the bundle files first when ``FLATPACK_BUNDLE_S3_URI`` says they are in S3
(parts too large for the package), and builds the :class:`functions.runtime.FunctionRuntime`. Whatever
fails is an :class:`functions.errors.InitError` naming the function: the handlers answer it as the
structured error every target gives, never as an escaped exception.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import functions
from functions.bundle import sha256_file
from functions.config import FunctionConfig
from functions.errors import InitError
from functions.plan import Plan
from functions.procstat import reset_peak_rss
from functions.runtime import FunctionRuntime

__all__ = ["PACKAGE_ROOT", "fetch_bundle", "retire", "start_runtime"]

log = logging.getLogger(__name__)

#: the directory the function package unpacks to: ``functions/`` lies in it, and so does ``bundle/``
PACKAGE_ROOT = Path(functions.__file__).resolve().parent.parent


def start_runtime(environ: Mapping[str, str] | None = None) -> FunctionRuntime:
    """The runtime of this instance, from its environment (default: the process's). Raises InitError."""
    try:
        config = FunctionConfig.from_env(environ)
    except ValueError as e:
        # no configuration to take the function's name from: the one variable that names it, as set
        name = (os.environ if environ is None else environ).get("FLATPACK_FUNCTION") or None
        raise InitError(f"the function could not start: {e}", function=name) from e
    try:
        return FunctionRuntime(_locate_bundle(config))
    except InitError as e:
        e.function = e.function or config.function
        raise
    except Exception as e:  # noqa: BLE001 - a bundle fetch or backend load fails in many ways: all are InitError
        raise InitError(f"the function could not start: {e}", function=config.function) from e


def retire(runtime: FunctionRuntime) -> None:
    """Close an instance's runtime that went over its memory, and start its replacement's memory count
    from here (what a platform does by killing it and starting another)."""
    runtime.close()
    reset_peak_rss()


def _locate_bundle(config: FunctionConfig) -> FunctionConfig:
    if config.bundle_s3_uri:
        # /tmp is the only writable place in a Lambda; it survives while the execution environment does
        root = Path(tempfile.gettempdir()) / "flatpack" / config.deployment / config.function
        return replace(config, bundle_dir=fetch_bundle(config.bundle_s3_uri, config.function, root,
                                                       endpoint_url=config.s3_endpoint_url,
                                                       region=config.aws_region))
    if not config.bundle_dir.is_absolute():
        return replace(config, bundle_dir=PACKAGE_ROOT / config.bundle_dir)
    return config


def fetch_bundle(uri: str, function: str, dest: Path, *, endpoint_url: str | None = None,
                 region: str | None = None) -> Path:
    """Fetch ``plan.json``, ``manifest.json`` and the files ``function`` runs from ``uri``
    (``s3://bucket/prefix``, as the deployers upload them) into ``dest``; each is checked against the
    manifest's sha256, and files already there with the right digest are not fetched again."""
    import boto3  # the Lambda runtime ships boto3; nothing else needs it

    if not uri.startswith("s3://"):
        raise ValueError(f"FLATPACK_BUNDLE_S3_URI={uri!r} is not an s3://bucket/prefix URI")
    bucket, _, prefix = uri[5:].partition("/")
    prefix = prefix.strip("/")
    s3 = boto3.client("s3", endpoint_url=endpoint_url, region_name=region)
    dest.mkdir(parents=True, exist_ok=True)

    def fetch(rel: str) -> Path:
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".part")
        s3.download_file(bucket, f"{prefix}/{rel}" if prefix else rel, str(tmp))
        os.replace(tmp, out)
        return out

    manifest = json.loads(fetch("manifest.json").read_text())
    digests = manifest.get("files", {})
    plan_path = fetch("plan.json")
    if digests.get("plan.json") not in (None, sha256_file(plan_path)):
        raise ValueError(f"{uri}/plan.json does not match the bundle manifest (sha256); deploy the bundle again")
    plan = Plan.load(plan_path)
    wanted = {p.file for s in plan.stages for p in s.parts if p.function == function}
    if function == plan.master:
        wanted |= {s.epilogue for s in plan.stages if s.epilogue}
    for rel in sorted(wanted):
        path = dest / rel
        if not (path.is_file() and sha256_file(path) == digests.get(rel)):
            fetch(rel)
        if sha256_file(path) != digests.get(rel):
            raise ValueError(f"{uri}/{rel} does not match the bundle manifest (sha256); deploy the bundle again")
    log.info("fetched the bundle of %s from %s (%d files)", function, uri, len(wanted) + 2)
    return dest

"""What the cloud targets render from: a bundle's functions, named, sized and configured.

Both cloud deployers (AWS Lambda, OpenFaaS) turn a bundle into the same list of
:class:`CloudFunction` — the deployed name (``<deployment>-<plan function>``), memory, the bundle files
the function runs, its role, and its ``FLATPACK_*`` environment from :class:`functions.config.FunctionConfig`
— and then write it out in their own form. This module also copies the function runtime (the
``functions/`` package, exactly what the local platform runs) and the bundle into a service directory.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import yaml

import functions
from functions.bundle import Bundle
from functions.config import FunctionConfig
from functions.plan import Plan

__all__ = [
    "CloudFunction",
    "DEPLOYMENT_RE",
    "bundle_files",
    "clear_rendered",
    "cloud_functions",
    "config_env",
    "copy_bundle",
    "copy_runtime",
    "dir_bytes",
    "runtime_requirements",
    "write_json",
    "write_yaml",
]

#: a deployment name usable in Lambda/Kubernetes/S3 names: lowercase, digits, '-'; the function names
#: built from it stay within Lambda's 64 and Kubernetes' 63 characters.
DEPLOYMENT_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")

Role = Literal["master", "worker"]


@dataclass(frozen=True)
class CloudFunction:
    """One plan function as a cloud function.

    ``files`` are the bundle files it runs (its parts; the master also the epilogues); ``env`` is its
    ``FLATPACK_*`` environment (the deployer adds the bundle location).
    """

    plan_name: str
    name: str
    memory_mb: int
    role: Role
    files: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


def bundle_files(plan: Plan, function: str) -> tuple[str, ...]:
    """The bundle files ``function`` opens: its parts, and the epilogues if it is the master."""
    files = {p.file for s in plan.stages for p in s.parts if p.function == function}
    if function == plan.master:
        files |= {s.epilogue for s in plan.stages if s.epilogue}
    return tuple(sorted(files))


_DEFAULTS = {f.name: f.default for f in fields(FunctionConfig)}


def config_env(config: FunctionConfig, *, drop: Iterable[str] = ()) -> dict[str, str]:
    """The ``FLATPACK_*`` variables of ``config`` that differ from the defaults (plus the required ones).

    ``drop`` names fields the deployer sets another way (e.g. ``bundle_dir``).
    """
    env = config.to_env()
    skip = set(drop)
    out: dict[str, str] = {}
    for name, default in _DEFAULTS.items():
        if name in skip:
            continue
        value = getattr(config, name)
        if name in ("bundle_dir", "deployment", "function") or value != default:
            out[f"FLATPACK_{name.upper()}"] = env[f"FLATPACK_{name.upper()}"]
    return out


def cloud_functions(plan: Plan, deployment: str, base: FunctionConfig, *,
                    threads: Mapping[int, int] | None = None, drop: Iterable[str] = ("bundle_dir",)
                    ) -> tuple[CloudFunction, ...]:
    """Every plan function, master first, with ``base`` (a FunctionConfig for the master) adapted to it.

    ``threads`` maps a memory size to onnxruntime intra-op threads (the platform's vCPU share).
    """
    if not DEPLOYMENT_RE.match(deployment):
        raise ValueError(f"deployment name {deployment!r}: use lowercase letters, digits and '-' "
                         f"(at most 40 characters, not starting or ending with '-')")
    out = []
    drop = tuple(drop)
    for fn in plan.functions:
        cfg = FunctionConfig(**{**{f.name: getattr(base, f.name) for f in fields(FunctionConfig)},
                                "function": fn.name, "memory_mb": fn.memory_mb,
                                "intra_op_threads": (threads or {}).get(fn.memory_mb, base.intra_op_threads)})
        out.append(CloudFunction(
            plan_name=fn.name,
            name=cfg.deployed_name(fn.name),
            memory_mb=fn.memory_mb,
            role="master" if fn.name == plan.master else "worker",
            files=bundle_files(plan, fn.name),
            env=config_env(cfg, drop=drop),
        ))
    out.sort(key=lambda f: f.role != "master")
    return tuple(out)


def copy_runtime(dest: Path) -> Path:
    """Copy the ``functions`` package (the runtime every function runs) to ``dest/functions``."""
    src = Path(functions.__file__).resolve().parent
    target = dest / "functions"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyi", "py.typed"))
    return target


def copy_bundle(bundle: Bundle, dest: Path, *, with_source: bool = False) -> Path:
    """Copy a verified bundle's plan, manifest and parts to ``dest`` (``source.onnx`` only if asked:
    no function opens it)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for rel in bundle.manifest.get("files", {}):
        if rel == "source.onnx" and not with_source:
            continue
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(bundle.root / rel, out)
    shutil.copy2(bundle.root / "manifest.json", dest / "manifest.json")
    return dest


def dir_bytes(path: Path) -> int:
    """Bytes of every file under ``path`` (0 if it does not exist)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


class _Dumper(yaml.SafeDumper):
    """Block style; multi-line strings as literal blocks; no anchors/aliases (CloudFormation has none)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, s: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)


_Dumper.add_representer(str, _str)


def write_yaml(path: Path, doc: Mapping[str, Any], *, header: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.dump(dict(doc), Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)
    comment = "".join(f"# {line}\n".replace("# \n", "#\n") for line in header.splitlines()) if header else ""
    path.write_text(comment + text)
    return path


def write_json(path: Path, doc: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def runtime_requirements(backend: str, extra: Iterable[str] = ()) -> str:
    """A requirements.txt for a function image running ``backend`` (``mxnet``: the MXNet environment's
    pins, functions/backends/mxnet-requirements.txt), plus ``extra`` (redis, boto3 for those transports)."""
    if backend != "mxnet":
        raise ValueError(f"backend {backend!r} has no image requirements here (onnxruntime uses the template's)")
    src = Path(functions.__file__).resolve().parent / "backends" / "mxnet-requirements.txt"
    return src.read_text() + "".join(f"{r}\n" for r in extra)


def clear_rendered(out: Path, *, marker: str, generated: Iterable[str], what: str) -> None:
    """Make ``out`` ready for a fresh render: remove the ``generated`` entries a previous render left there.

    A directory that holds anything but lacks ``marker`` (the file every render writes) is someone else's:
    it raises FileExistsError naming ``what`` (e.g. "service") rather than delete files it did not write."""
    if out.exists() and any(out.iterdir()) and not (out / marker).is_file():
        raise FileExistsError(f"{out} exists and is not a rendered flatpack {what}; give an empty or new -o DIR")
    for name in generated:
        p = out / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()

"""A bundle on disk: plan.json, manifest.json, source.onnx and parts/*.onnx.

The manifest records the sha256 of every file and of the model the bundle was cut from, so a function
can refuse a bundle that was changed after it was verified.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from functions.plan import Plan, PlanError

__all__ = ["MANIFEST_SCHEMA", "Bundle", "BundleError", "sha256_file"]

MANIFEST_SCHEMA = "flatpack.bundle/1"


class BundleError(ValueError):
    """A bundle directory that is incomplete, altered, or of an unknown schema."""


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class Bundle:
    root: Path
    plan: Plan
    manifest: dict[str, Any]

    @property
    def source(self) -> Path:
        return self.root / "source.onnx"

    def path(self, rel: str) -> Path:
        return self.root / rel

    @classmethod
    def load(cls, root: str | Path, *, check_hashes: bool = True) -> Bundle:
        root = Path(root)
        if not (root / "plan.json").is_file():
            raise BundleError(f"{root} is not a bundle (no plan.json); create one with `flatpack export`")
        try:
            plan = Plan.load(root / "plan.json")
            manifest = json.loads((root / "manifest.json").read_text())
        except FileNotFoundError as e:
            raise BundleError(f"{root}: missing {Path(e.filename).name}") from e
        except (json.JSONDecodeError, PlanError) as e:
            raise BundleError(f"{root}: {e}") from e
        if manifest.get("schema") != MANIFEST_SCHEMA:
            raise BundleError(
                f"{root}/manifest.json has schema {manifest.get('schema')!r}, expected {MANIFEST_SCHEMA!r}"
            )
        bundle = cls(root, plan, manifest)
        if check_hashes:
            bundle.check()
        return bundle

    def check(self) -> None:
        """Raise BundleError if a file is missing or differs from the manifest."""
        files: dict[str, str] = self.manifest.get("files", {})
        needed = {p.file for s in self.plan.stages for p in s.parts} | {
            s.epilogue for s in self.plan.stages if s.epilogue
        }
        missing = sorted(needed - set(files))
        if missing:
            raise BundleError(f"{self.root}: manifest does not list {missing}")
        for rel, digest in files.items():
            path = self.root / rel
            if not path.is_file():
                raise BundleError(f"{self.root}: {rel} is missing")
            if sha256_file(path) != digest:
                raise BundleError(f"{self.root}: {rel} changed since export (sha256 mismatch); re-export the bundle")

"""The bundles the local platform's functions run: copies in its own state directory, checked against their
manifests.

A function's ``bundle_dir`` is never a path the caller chose: a deployer first asks the platform to take
in a bundle (:meth:`BundleStore.stage`: every file the manifest lists, and nothing else, is copied into
``<platform home>/bundles/<manifest sha256>`` and its sha256 checked on the way), then registers functions
on the directory it got back. :meth:`BundleStore.verify` refuses any other directory, and one whose files
no longer match the manifest, before an instance starts on it. The store is private to the platform's
owner (mode 0700), so no other user can change a bundle after it was checked.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import secrets
import shutil
import stat
import threading
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from functions.bundle import MANIFEST_SCHEMA, Bundle, BundleError

__all__ = ["BundleStore"]

_CHUNK = 1 << 20


def _rel(rel: object, manifest: Path) -> str:
    """A manifest entry as a safe relative path (no absolute paths, no ``..``)."""
    p = PurePosixPath(str(rel))
    if not str(rel) or p.is_absolute() or any(part in ("..", "") for part in p.parts) or "\\" in str(rel):
        raise BundleError(f"{manifest} lists {rel!r}, which is not a path inside the bundle")
    return str(p)


def _copy_hashed(src: Path, dst: Path) -> str:
    """Copy a regular file, returning the sha256 of what was written. (A link in the deployer's bundle is
    followed: what it points to is hashed and copied; the store itself holds no links.)"""
    fd = os.open(src, os.O_RDONLY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BundleError(f"{src} is not a regular file")
        h = hashlib.sha256()
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            while block := os.read(fd, _CHUNK):
                h.update(block)
                os.write(out, block)
        finally:
            os.close(out)
    finally:
        os.close(fd)
    return h.hexdigest()


def _sha256(path: Path, *, follow: bool = False) -> str:
    fd = os.open(path, os.O_RDONLY if follow else os.O_RDONLY | os.O_NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BundleError(f"{path} is not a regular file")
        h = hashlib.sha256()
        while block := os.read(fd, _CHUNK):
            h.update(block)
    finally:
        os.close(fd)
    return h.hexdigest()


def _load_manifest(root: Path, *, follow: bool = False) -> tuple[bytes, dict[str, str]]:
    path = root / "manifest.json"
    try:
        fd = os.open(path, os.O_RDONLY if follow else os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise BundleError(f"{root} is not a bundle: cannot read its manifest.json ({e.strerror})") from e
    try:
        raw = b""
        while block := os.read(fd, _CHUNK):
            raw += block
    finally:
        os.close(fd)
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise BundleError(f"{path} is not JSON: {e}") from e
    if not isinstance(doc, dict) or doc.get("schema") != MANIFEST_SCHEMA:
        raise BundleError(f"{path} is not a {MANIFEST_SCHEMA} manifest")
    files = doc.get("files")
    if not isinstance(files, dict) or "plan.json" not in files:
        raise BundleError(f"{path} lists no files (plan.json at least); re-export the bundle")
    return raw, {_rel(k, path): str(v) for k, v in files.items()}


class BundleStore:
    """Bundles under ``root`` (the platform's ``<home>/bundles``), one directory per manifest digest.

    Thread-safe: staging runs in worker threads. Verification results are remembered per directory with
    the size, mtime and inode of every file, so a deployment's N functions hash their bundle once.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._verified: dict[Path, tuple[tuple[int, int, int], ...]] = {}

    def stage(self, source: str | Path) -> Path:
        """Copy the bundle at ``source`` into the store (once per manifest) and return its directory there.

        Raises:
            BundleError: ``source`` is not a bundle, lists paths outside itself, or a file's sha256 differs
                from its manifest (the bundle was changed after export).
        """
        src = Path(source)
        raw, files = _load_manifest(src, follow=True)
        digest = hashlib.sha256(raw).hexdigest()[:32]
        final = self.root / digest
        if final.is_dir():
            # taken in before: the source must still match its manifest (a deployer is told of a changed
            # file either way), and the copy here is used unless it was changed since
            self._check_source(src, files)
            try:
                return self.verify(final)
            except BundleError:
                shutil.rmtree(final, ignore_errors=True)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.root / f".{digest}.{secrets.token_hex(4)}"
        os.mkdir(tmp, 0o700)
        try:
            for rel, want in files.items():
                dst = tmp / rel
                dst.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                _check_file(src, rel, want, functools.partial(_copy_hashed, src / rel, dst))
            (tmp / "manifest.json").write_bytes(raw)
            Bundle.load(tmp, check_hashes=False).check()  # the plan parses and names only listed files
            try:
                os.rename(tmp, final)
            except OSError:
                if not final.is_dir():  # not a concurrent stage of the same bundle that won the race
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return self.verify(final)

    @staticmethod
    def _check_source(src: Path, files: dict[str, str]) -> None:
        for rel, want in files.items():
            _check_file(src, rel, want, functools.partial(_sha256, src / rel, follow=True))

    def verify(self, bundle_dir: str | Path) -> Path:
        """``bundle_dir`` resolved, if it is a bundle directly in the store whose files all match its
        manifest; else BundleError saying why."""
        given = Path(bundle_dir)
        path = Path(os.path.realpath(given))
        root = Path(os.path.realpath(self.root))
        if path.parent != root or path.name.startswith(".") or not path.is_dir():
            raise BundleError(
                f"bundle_dir {str(given)!r} is not a bundle this platform took in: functions run bundles from the "
                f"platform's own state directory ({root}) only; stage it first (PUT /flatpack/bundles, "
                f"PlatformClient.stage_bundle)")
        _, files = _load_manifest(path)
        sig = tuple(self._stat(path / rel) for rel in sorted(files))
        with self._lock:
            if self._verified.get(path) == sig:
                return path
        for rel, want in files.items():
            try:
                got = _sha256(path / rel)
            except OSError as e:
                raise BundleError(f"{path}: cannot read {rel}: {e.strerror or e}") from e
            if got != want:
                raise BundleError(f"{path}: {rel} changed after it was checked (sha256 mismatch); deploy the "
                                  f"bundle again")
        with self._lock:
            self._verified[path] = sig
        return path

    @staticmethod
    def _stat(path: Path) -> tuple[int, int, int]:
        try:
            st = os.lstat(path)
        except OSError as e:
            raise BundleError(f"{path} is missing ({e.strerror})") from e
        return st.st_size, st.st_mtime_ns, st.st_ino


def _check_file(src: Path, rel: str, want: str, digest: Callable[[], str]) -> None:
    """``digest()`` (the sha256 of ``src / rel``, read or copied) must be the manifest's ``want``: a BundleError
    naming the file and the fix otherwise."""
    try:
        got = digest()
    except FileNotFoundError as e:
        raise BundleError(f"{src}: {rel} is missing (the manifest lists it)") from e
    except OSError as e:
        raise BundleError(f"{src}: cannot read {rel}: {e.strerror or e}") from e
    if got != want:
        raise BundleError(f"{src}: {rel} changed since export (sha256 {got[:12]}..., the manifest says "
                          f"{want[:12]}...); re-export the bundle")

"""Shared-memory transport: one tmpfs file per tensor under ``/dev/shm/flatpack/<deployment>/`` (MOPAR's way).

Files are created 0600 in a 0700 directory and named ``<request>.<tensor>``. ``get`` maps the file and
returns a read-only numpy view of it: no copy, whatever the tensor's size, and a region of it costs only
the pages that region touches. Works between processes on one host only.

Delete-after-read unlinks the name at once (the mapping keeps the pages alive while the array lives).
Writing a tensor into fresh tmpfs pages costs the kernel a page allocation and zeroing per 4 KB, which
makes a put about twice as slow as a memcpy. So files read with ``delete=True`` are *recycled*: once the
reader's last view of the mapping is gone, the file moves to a per-size-class free list
(``.free/<class>/``) and the next put of that class overwrites it in place. A file is recycled only when
no mapping of it is left in the reading process and nobody else could still read it (its name was
removed when it was read), so a recycled file is never written while someone reads it. Files that may
be mapped elsewhere are only ever unlinked, never truncated (truncating a mapped file would SIGBUS its
readers).

A discarded request (:meth:`Transport.discard`: its master died) leaves an empty mark file,
``.dead/<request>``; a put that finds its request's mark after writing unlinks what it wrote.

The backstop: :meth:`ShmTransport.sweep` unlinks files older than an age (the local platform runs it),
marks included.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import mmap
import os
import shutil
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from functions.codec import Buffer, Compression, advance_views, decode, encode_parts
from functions.errors import TransportError
from functions.transport.base import TensorKey, Transport

__all__ = ["ShmTransport"]

log = logging.getLogger(__name__)

_FREE = ".free"
_HELD = ".held"
_DEAD = ".dead"  # marks of discarded requests, one empty file per request id
_MIN_CLASS = 64 * 1024
_PAGE = 4096


def _size_class(n: int) -> int:
    """Smallest ``m * 2**e + 4096`` (m in 4..7) that holds ``n`` bytes: at most 25 % slack, and a tensor
    whose payload is a power of two (the usual case) fits its class with the header in the extra page."""
    body = max(n - _PAGE, _MIN_CLASS)
    e = max(body.bit_length() - 3, 0)
    m = -(-body // (1 << e))  # ceil
    if m > 7:
        m, e = 4, e + 1
    return (m << e) + _PAGE


class ShmTransport(Transport):
    """Tensors as files in ``root`` (a tmpfs directory, ``/dev/shm/flatpack`` by default).

    Parameters
    ----------
    root: directory that holds one subdirectory per deployment.
    recycle_max_bytes: largest file recycled through the free list; larger ones are unlinked.
    pool_bytes_per_class: free files kept per size class (at least two), in bytes; the rest are unlinked.
    writer_cache_bytes: mappings of recycled files this process keeps for writing.
    """

    scheme = "shm"
    zero_copy = True

    def __init__(
        self,
        root: str | Path = "/dev/shm/flatpack",  # noqa: S108 - tmpfs shared between processes is the point
        *,
        recycle_max_bytes: int = 128 * 1024 * 1024,
        pool_bytes_per_class: int = 64 * 1024 * 1024,
        writer_cache_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        self.root = Path(root)
        self._root = str(root)
        # unique across processes and across transports in one process
        self._held_tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._recycle_max = recycle_max_bytes
        self._pool_bytes = pool_bytes_per_class
        self._dirs: dict[str, str] = {}  # deployment -> its directory, created
        # inode -> writable mapping of a recycled file, least recently used first. Keeping them makes a
        # put into a recycled file a plain memcpy. While cached, a mapping pins its file's pages even if
        # the file is unlinked elsewhere, hence the byte budget.
        self._maps: OrderedDict[int, mmap.mmap] = OrderedDict()
        self._mapped = 0
        self._writer_cache_bytes = writer_cache_bytes
        self._held_ids = itertools.count()
        self._lock = threading.Lock()

    # -- paths -------------------------------------------------------------------------------------------

    def _dir(self, deployment: str) -> str:
        d = self._dirs.get(deployment)
        if d is None:
            d = os.path.join(self._root, deployment)
            with self._lock:
                try:
                    os.makedirs(self._root, mode=0o700, exist_ok=True)
                    _mkdir_private(d)
                    _mkdir_private(os.path.join(d, _HELD))
                    _mkdir_private(os.path.join(d, _FREE))
                except OSError as e:
                    raise TransportError(f"cannot create shared-memory directory {d}: {e}") from e
                self._dirs[deployment] = d
        return d

    def _path(self, key: TensorKey) -> str:
        return f"{self._dir(key.deployment)}/{key.request_id}.{key.name}"

    # -- the interface -----------------------------------------------------------------------------------

    def put(self, key: TensorKey, array: np.ndarray, *, compression: Compression = "none") -> str:
        head, payload = encode_parts(array, compression)
        path = self._path(key)
        self._store(key.deployment, path, head, payload)
        if os.path.exists(self._mark(key.deployment, key.request_id)):
            # the request was discarded while (or before) this was written: see Transport.discard
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            log.debug("dropped %s: request %s was discarded", path, key.request_id)
        return self.ref(key)

    def _store(self, deployment: str, path: str, head: bytes, payload: Buffer) -> None:
        size = len(head) + memoryview(payload).nbytes
        fd = self._claim(deployment, size, path)
        if fd is not None:
            try:
                self._write_recycled(fd, head, payload)
            except (OSError, ValueError) as e:
                with contextlib.suppress(OSError):
                    os.unlink(path)
                raise TransportError(f"cannot write {size} bytes to {path}: {e}") from e
            finally:
                os.close(fd)
            return
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError as e:
            raise TransportError(f"shared-memory tensor {path} already exists (key reused)") from e
        except OSError as e:
            raise TransportError(f"cannot create shared-memory tensor {path}: {e}") from e
        try:
            _write_all(fd, [head, payload])
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise TransportError(f"cannot write {size} bytes to {path}: {e} (is /dev/shm full?)") from e
        finally:
            os.close(fd)

    def get(self, ref: str, *, delete: bool = False) -> np.ndarray:
        key = self.key_of(ref)
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError as e:
            raise TransportError(
                f"tensor {ref} is not in shared memory ({path}): deleted, swept, or never written"
            ) from e
        try:
            size = os.fstat(fd).st_size
            mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        except (OSError, ValueError) as e:
            raise TransportError(f"cannot map {path}: {e}") from e
        finally:
            os.close(fd)
        if delete:
            self._release(key.deployment, path, size, mm)
        try:
            return decode(mm)
        except ValueError as e:
            raise TransportError(f"shared-memory tensor {path} is corrupt: {e}") from e

    def delete(self, refs: Iterable[str]) -> None:
        for ref in refs:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(self.key_of(ref)))

    def purge(self, deployment: str, request_id: str | None = None) -> int:
        d = self.root / deployment
        if not d.is_dir():
            return 0
        if request_id is None:
            n = self.count(deployment)
            self.close()  # drop cached mappings, which would pin the removed files' pages
            shutil.rmtree(d, ignore_errors=True)
            with self._lock:
                self._dirs.pop(deployment, None)
            return n
        n = 0
        for p in d.glob(f"{request_id}.*"):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                n += 1
        return n

    def discard(self, deployment: str, request_id: str) -> int:
        """:meth:`Transport.discard`, and the held files of processes that are gone are unlinked: a master
        killed mid-request leaves the outputs it had read (held for recycling, see the module docstring)
        with no one left to recycle them."""
        n = super().discard(deployment, request_id)
        self._unlink_orphans(deployment)
        return n

    def _mark(self, deployment: str, request_id: str) -> str:
        return f"{self._dir(deployment)}/{_DEAD}/{request_id}"

    def _mark_discarded(self, deployment: str, request_id: str) -> None:
        path = self._mark(deployment, request_id)
        try:
            _mkdir_private(os.path.dirname(path))  # a directory made before marks existed has none
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        except OSError as e:
            raise TransportError(f"cannot mark request {request_id} discarded ({path}): {e}") from e

    def _unlink_orphans(self, deployment: str) -> None:
        held = f"{self._dir(deployment)}/{_HELD}"
        try:
            names = os.listdir(held)
        except FileNotFoundError:
            return
        for name in names:
            pid = name.split("-", 1)[0]
            if pid.isdigit() and not _pid_alive(int(pid)):
                # unlinking (never truncating) is safe even if another process still maps the file
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{held}/{name}")

    def close(self) -> None:
        with self._lock:
            maps, self._maps, self._mapped = list(self._maps.values()), OrderedDict(), 0
        for mm in maps:
            mm.close()

    def count(self, deployment: str) -> int:
        d = self.root / deployment
        if not d.is_dir():
            return 0
        return sum(1 for e in os.scandir(d) if e.is_file() and not e.name.startswith("."))

    def sweep(self, max_age_s: float) -> int:
        """Unlink tensors, held and free files older than ``max_age_s`` in every deployment."""
        if not self.root.is_dir():
            return 0
        cutoff = time.time() - max_age_s
        n = 0
        for dirpath, _, files in os.walk(self.root):
            for name in files:
                p = os.path.join(dirpath, name)
                try:
                    if os.stat(p).st_mtime < cutoff:
                        os.unlink(p)
                        n += 1
                except FileNotFoundError:
                    continue
        return n

    # -- recycling ---------------------------------------------------------------------------------------

    def _class_dir(self, deployment: str, cls: int) -> str:
        return f"{self._dir(deployment)}/{_FREE}/{cls}"

    def _claim(self, deployment: str, size: int, path: str) -> int | None:
        """Take a free file of ``size``'s class, renamed to ``path``; None when there is none."""
        if size > self._recycle_max:
            return None
        free = self._class_dir(deployment, _size_class(size))
        try:
            names = os.listdir(free)
        except FileNotFoundError:
            return None
        for name in names:
            try:
                os.rename(f"{free}/{name}", path)  # atomic: of two claimers of one file, one wins
            except FileNotFoundError:
                continue
            try:
                return os.open(path, os.O_RDWR)
            except OSError:
                continue
        return None

    def _write_recycled(self, fd: int, head: bytes, payload: Buffer) -> None:
        """Write into a recycled file through a mapping this process keeps, so the write is a plain
        memcpy into pages that are already mapped (no page faults, no per-page kernel copy)."""
        st = os.fstat(fd)
        with self._lock:
            mm = self._maps.get(st.st_ino)
            if mm is not None:
                self._maps.move_to_end(st.st_ino)
        if mm is None or len(mm) < st.st_size:
            mm = mmap.mmap(fd, st.st_size)
            with self._lock:
                self._maps[st.st_ino] = mm
                self._mapped += len(mm)
                while self._mapped > self._writer_cache_bytes and len(self._maps) > 1:
                    _, old = self._maps.popitem(last=False)
                    self._mapped -= len(old)
                    old.close()
        n = len(head)
        body = memoryview(payload).cast("B")
        mm[:n] = head
        if body.nbytes:
            np.copyto(np.frombuffer(mm, dtype=np.uint8, count=body.nbytes, offset=n), np.frombuffer(body, np.uint8))
        os.utime(fd)  # writes through a mapping leave mtime alone; the sweeper goes by it

    def _release(self, deployment: str, path: str, size: int, mm: mmap.mmap) -> None:
        """Remove ``path``'s name now; recycle the file once ``mm`` (and every view of it) is gone."""
        if size < _MIN_CLASS or size > self._recycle_max:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
        cls = _size_class(size)
        if size != cls:
            # A fresh file has the tensor's exact size; grow it to its class so it can take any tensor of
            # that class. Growing (never shrinking) is safe under existing mappings.
            try:
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.ftruncate(fd, cls)
                finally:
                    os.close(fd)
            except OSError:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                return
        self._hold(deployment, path, cls, mm)

    def _hold(self, deployment: str, path: str, cls: int, mm: mmap.mmap) -> None:
        held = f"{self._dir(deployment)}/{_HELD}/{self._held_tag}-{next(self._held_ids)}"
        try:
            os.rename(path, held)
        except OSError:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
        limit = max(2, self._pool_bytes // cls)
        weakref.finalize(mm, _recycle, held, self._class_dir(deployment, cls), limit)


def _recycle(held: str, free: str, limit: int) -> None:
    """Move a no-longer-mapped file to its free list, or unlink it if the list is full."""
    try:
        try:
            n = len(os.listdir(free))
        except FileNotFoundError:
            _mkdir_private(free)
            n = 0
        if n < limit:
            os.rename(held, f"{free}/{os.path.basename(held)}")
            return
    except OSError:
        pass
    with contextlib.suppress(OSError):
        os.unlink(held)


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a process of another user counts: it may hold the file)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mkdir_private(path: str) -> None:
    """mkdir 0700 (os.makedirs applies its mode to the last level only)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass


def _write_all(fd: int, bufs: Iterable[Buffer]) -> None:
    views = [memoryview(b).cast("B") for b in bufs if memoryview(b).nbytes]
    while views:
        try:
            n = os.writev(fd, views)
        except InterruptedError:
            continue
        if n == 0:
            raise OSError(errno.ENOSPC, "short write")
        advance_views(views, n)

"""Starting instances from a zygote (see :mod:`functions.zygote`): the platform's side.

:class:`Zygote` runs ``python -m functions.zygote`` for one interpreter, and :meth:`Zygote.spawn` has it
fork an instance with a function's environment, its cgroups and three new pipes. The instance is the
platform's own child (the platform is a child subreaper), watched through a pidfd: :class:`ForkedProcess`
gives it the parts of :class:`asyncio.subprocess.Process` an :class:`~serving.platform.instance.Instance`
uses (``pid``, ``returncode``, the three streams, ``wait``, ``kill``).

Where a zygote cannot run (not Linux, a kernel without pidfds, the zygote failed to start or died), the
platform starts instances as new interpreters, as before: :class:`ZygoteUnavailable` says why.

Being a child subreaper is process-wide: once a zygote has started, an orphan of any of the platform
process's descendants becomes its child too. Nothing the platform starts leaves orphans (instances do not
fork); a daemon that double-forked from one would stay a zombie of the platform until the platform exits.

A forked instance shares the pages the zygote loaded (numpy, onnxruntime) until it writes to them. Its
resident memory (``/proc``, what the platform checks after every request) counts them as before; a memory
cgroup charges them to the zygote, so the kernel's own limit on the instance is looser by what it shares.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import os
import select
import signal
import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from functions.zygote import FD_ENV

__all__ = ["ForkedProcess", "Zygote", "ZygoteUnavailable"]

log = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36
_MAX_REPLY = 1 << 16


class ZygoteUnavailable(RuntimeError):
    """The zygote cannot start instances (here, or any more); the platform starts them itself."""


def _make_subreaper() -> None:
    """Orphans of this process's descendants (the instances the zygote's middle process leaves) become its
    own children."""
    if not hasattr(os, "pidfd_open"):
        raise ZygoteUnavailable("this system has no pidfds")
    try:  # Python has the call on any Linux; the kernel has it from 5.3
        os.close(os.pidfd_open(os.getpid()))
    except OSError as e:
        raise ZygoteUnavailable(f"this kernel has no pidfds ({e})") from e
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise ZygoteUnavailable(f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}")


class ForkedProcess:
    """An instance the zygote forked, now this process's child: what an Instance needs of a process.

    Its pipes are this object's to close (:meth:`close`, once it is gone): a pipe transport left to the
    garbage collector closes its file descriptor whenever that runs, by then perhaps another file's.

    ``returncode`` and :meth:`kill` may be called from any thread (a benchmark's fault injector reads the
    pools from its own); the rest runs on the event loop it was made on."""

    def __init__(self, pid: int, stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader,
                 stderr: asyncio.StreamReader, transports: Sequence[asyncio.BaseTransport]) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self._transports = list(transports)
        self._returncode: int | None = None
        self._lock = threading.Lock()  # over _pidfd and _returncode: reaped, and the pidfd given up, once
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = self._loop.create_future()
        self._pidfd: int | None = os.pidfd_open(pid)
        self._ended_poll = select.poll()  # every `alive` asks it: made once
        self._ended_poll.register(self._pidfd, select.POLLIN)
        self._loop.add_reader(self._pidfd, self._reap)

    @property
    def returncode(self) -> int | None:
        """None while it runs. Asked, it looks (the pidfd, without waiting) rather than wait for the loop to
        hear of its end: a pool must not hand a request to an instance that died a moment ago."""
        if self._returncode is None:
            self._reap()
        return self._returncode

    def _reap(self) -> None:
        """If it has ended (its pidfd is readable), reap it (it is a zombie of ours until then) and give its
        pidfd up on the loop."""
        with self._lock:
            fd = self._pidfd
            if fd is None:
                return
            if not self._ended_poll.poll(0):
                return
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: nothing says how it ended
                pid, status = self.pid, 255 << 8
            if pid == 0:
                return
            self._returncode = os.waitstatus_to_exitcode(status)
            self._pidfd = None  # no thread signals or polls it from here on
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._ended(fd)
        else:
            try:
                self._loop.call_soon_threadsafe(self._ended, fd)
            except RuntimeError:  # its loop is closed: nothing watches the pidfd any more
                os.close(fd)

    def _ended(self, fd: int) -> None:
        self._loop.remove_reader(fd)
        os.close(fd)
        self.stdin.close()  # what it has not read is lost with it; its output is read to the end
        if not self._exited.done():
            assert self._returncode is not None
            self._exited.set_result(self._returncode)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def send_signal(self, sig: int) -> None:
        with self._lock:
            if self._pidfd is None:
                raise ProcessLookupError(self.pid)
            signal.pidfd_send_signal(self._pidfd, sig)  # the pidfd, not the pid: never another process's

    def close(self) -> None:
        """Close its pipes (once it has ended and what it wrote was read)."""
        for t in self._transports:
            t.close()


async def _reader(fd: int) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(loop=loop)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop),
                                                os.fdopen(fd, "rb", 0))
    return reader, transport


async def _writer(fd: int) -> tuple[asyncio.StreamWriter, asyncio.BaseTransport]:
    loop = asyncio.get_running_loop()
    protocol = asyncio.StreamReaderProtocol(asyncio.StreamReader(loop=loop), loop=loop)
    transport, _ = await loop.connect_write_pipe(lambda: protocol, os.fdopen(fd, "wb", 0))
    return asyncio.StreamWriter(transport, protocol, None, loop), transport


class Zygote:
    """``python -m functions.zygote`` under ``python`` with ``env``, started on the first :meth:`spawn`.

    Once it failed to start (or its interpreter cannot run it), :meth:`spawn` raises
    :class:`ZygoteUnavailable` at once: the platform starts instances itself from then on. A zygote that
    died after it started is started again on the next spawn.
    """

    def __init__(self, python: str, env: Mapping[str, str], *, start_timeout_s: float = 60.0) -> None:
        self.python = python
        self._env = dict(env)
        self._timeout = start_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()  # one exchange at a time on the socket
        self.failed: str | None = None
        self.spawned = 0

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def _start(self) -> None:
        _make_subreaper()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            env = {**self._env, FD_ENV: str(theirs.fileno())}
            self._proc = subprocess.Popen(  # noqa: S603 - the platform's interpreter, our own module
                [self.python, "-m", "functions.zygote"], env=env, pass_fds=[theirs.fileno()],
                # no parent-death signal: that follows the thread that started it (a worker thread here);
                # it exits once the platform's end of the socket closes, however the platform ends
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        ours.settimeout(self._timeout)
        self._sock = ours
        try:
            ready = json.loads(ours.recv(_MAX_REPLY) or b"{}")
        except (OSError, ValueError) as e:
            ready = {"error": str(e)}
        if "ready" not in ready:
            self._stop()
            raise ZygoteUnavailable(f"the zygote under {self.python} did not start: {ready.get('error', 'it exited')}")
        ours.settimeout(None)
        log.info("zygote %d (%s) ready", self._proc.pid, self.python)

    def _spawn(self, env: Mapping[str, str], cgroups: Sequence[Path], fds: Sequence[int]) -> int:
        msg = json.dumps({"env": dict(env), "cgroups": [str(p) for p in cgroups]}).encode()
        with self._lock:
            # twice at most: a zygote killed a moment ago can still look alive to poll() and then drop the
            # request (the socket closes under it); a new one is started for the second try
            for attempt in (1, 2):
                self._ensure_started()
                assert self._sock is not None
                try:
                    socket.send_fds(self._sock, [msg], list(fds))
                    reply = json.loads(self._sock.recv(_MAX_REPLY) or b"{}")
                except (OSError, ValueError) as e:
                    self._stop()
                    if attempt == 1:
                        log.warning("the zygote did not answer (%s): starting another", e)
                        continue
                    log.warning("the zygote did not answer (%s): starting this instance as a new process", e)
                    raise ZygoteUnavailable(f"the zygote did not answer: {e}") from e
                if "pid" not in reply and attempt == 1 and self._proc is not None and self._proc.poll() is not None:
                    log.warning("zygote %d exited with the request (code %s); starting another", self._proc.pid,
                                self._proc.returncode)
                    self._stop()
                    continue
                break
        if "pid" not in reply:
            why = reply.get("error", "it exited")
            log.warning("the zygote refused an instance (%s): starting it as a new process", why)
            raise ZygoteUnavailable(f"the zygote refused: {why}")
        self.spawned += 1
        return int(reply["pid"])

    def _ensure_started(self) -> None:
        """A running zygote (the lock held): started again where it exited; ZygoteUnavailable, for good, where
        it cannot start."""
        if self.failed is not None:
            raise ZygoteUnavailable(self.failed)
        if self._proc is not None and self._proc.poll() is None:
            return
        if self._proc is not None:
            log.warning("zygote %d exited (code %s); starting another", self._proc.pid, self._proc.returncode)
            self._stop()
        try:
            self._start()
        except (OSError, ZygoteUnavailable) as e:
            self.failed = str(e)
            log.warning("%s; the platform starts instances as new processes from now on", e)
            raise ZygoteUnavailable(self.failed) from e

    async def spawn(self, env: Mapping[str, str], cgroups: Sequence[Path] = ()) -> ForkedProcess:
        """An instance with ``env`` in ``cgroups`` (their ``cgroup.procs`` files) and three new pipes."""
        pipes = [os.pipe2(os.O_CLOEXEC) for _ in range(3)]
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1]]
        ours = [pipes[0][1], pipes[1][0], pipes[2][0]]
        try:
            pid = await asyncio.to_thread(self._spawn, env, cgroups, theirs)
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        stdin, t_in = await _writer(ours[0])
        stdout, t_out = await _reader(ours[1])
        stderr, t_err = await _reader(ours[2])
        return ForkedProcess(pid, stdin, stdout, stderr, [t_in, t_out, t_err])

    def _stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(5)  # it exits once its socket closes
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
            self._proc = None

    def close(self) -> None:
        with self._lock:
            self._stop()

    def describe(self) -> dict[str, object]:
        return {"python": self.python, "pid": self.pid, "spawned": self.spawned, "failed": self.failed}

"""The local platform's instance starter: ``python -m functions.zygote``, one per interpreter.

A function instance (:mod:`functions.local_instance`) started as a new interpreter spends most of its cold
start's CPU importing numpy, onnxruntime and the runtime, before it loads its own parts. On a host whose
cores also serve the warm instances (the local platform), every start takes that CPU from them: a pool
that replaces killed instances slowed every request on the host. The zygote imports all of it once, then
forks each instance, which starts with it already loaded (Lambda's SnapStart does the same with a
snapshot). The instance then joins its cgroups, takes its function's environment and pipes, and runs
:func:`functions.local_instance.main` as the exec'd one would.

Protocol, over the ``AF_UNIX`` ``SOCK_SEQPACKET`` socket on fd ``FLATPACK_ZYGOTE_FD`` (one end of a socket
pair the platform made: nothing on the file system, so no other process can connect):

* zygote -> platform, once: ``{"ready": pid}`` once its imports are done;
* platform -> zygote, per instance: JSON ``{"env": {name: value}, "cgroups": [path, ...]}`` with three file
  descriptors (``SCM_RIGHTS``): the instance's stdin, stdout and stderr;
* zygote -> platform: ``{"pid": pid}``, or ``{"error": why}`` for a request it refused (nothing started).

The instance is forked twice, so that it is not the zygote's child: the platform makes itself a child
subreaper (``PR_SET_CHILD_SUBREAPER``) first, the middle process exits at once, and the instance becomes
the platform's own child, which the platform waits for, signals and reads the exit status of as it does
for an instance it started itself. The zygote exits when the platform closes its end.

Numpy is imported with one BLAS thread (``OPENBLAS_NUM_THREADS=1``, the zygote's own environment): a
process must not fork while a thread pool runs, and the runtime computes in onnxruntime, whose threads are
made per session, after the fork.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Sequence

__all__ = ["FD_ENV", "main"]

#: the environment variable that names the zygote's end of the socket pair
FD_ENV = "FLATPACK_ZYGOTE_FD"
_MAX_MESSAGE = 1 << 20


def _preload() -> None:
    """What every instance imports before it loads its parts (see the module docstring)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import numpy  # noqa: F401
    import onnxruntime  # noqa: F401

    import functions.config
    import functions.local_instance
    import functions.runtime  # noqa: F401


def _reply(sock: socket.socket, **body: object) -> None:
    sock.send(json.dumps(body).encode())


def _request(raw: bytes) -> tuple[dict[str, str], list[str]]:
    """The request's environment and cgroups; ValueError if it is not one."""
    msg = json.loads(raw)
    env, cgroups = msg.get("env") if isinstance(msg, dict) else None, msg.get("cgroups", [])
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("env must be an object of strings")
    if not isinstance(cgroups, list) or not all(isinstance(p, str) for p in cgroups):
        raise ValueError("cgroups must be a list of paths")
    return env, cgroups


def _become_instance(env: dict[str, str], cgroups: Sequence[str], fds: Sequence[int], close: Sequence[int]) -> None:
    """In the forked instance: its session, cgroups, pipes and environment, then the instance's main. Never
    returns."""
    rc = 1
    try:
        os.setsid()  # a Ctrl-C at the platform's terminal must not reach it, as for an exec'd instance
        for fd in close:
            os.close(fd)
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        # its cgroups before anything else: what it does from here runs inside its limit
        for path in cgroups:
            try:
                with open(path, "w") as f:
                    f.write(str(os.getpid()))
            except OSError as e:
                os.write(2, f"flatpack-zygote: cannot join cgroup {path}: {e}\n".encode())
                os._exit(126)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [sys.executable, "-m", "functions.local_instance"]
        from functions import local_instance

        rc = local_instance.main()
    except BaseException as e:  # noqa: BLE001 - whatever it is, it must not return into the zygote's loop
        with open(2, "w", closefd=False) as err:
            err.write(f"flatpack-zygote: instance failed: {e!r}\n")
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - its pipe may be gone; it exits either way
                pass
        os._exit(rc)


def _spawn(sock: socket.socket, env: dict[str, str], cgroups: list[str], fds: list[int]) -> int:
    """Fork the instance (twice: see the module docstring); its pid."""
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    middle = os.fork()
    if middle == 0:  # the middle process: fork the instance, tell its pid, exit
        try:
            os.close(r)
            pid = os.fork()
            if pid == 0:
                _become_instance(env, cgroups, fds, close=[w, sock.fileno()])
            os.write(w, str(pid).encode())
        finally:
            os._exit(0)
    os.close(w)
    try:
        raw = b""
        while chunk := os.read(r, 32):
            raw += chunk
    finally:
        os.close(r)
        os.waitpid(middle, 0)  # once it is gone the instance is the platform's child
    if not raw:
        raise OSError("the instance could not be forked")
    return int(raw)


def serve(sock: socket.socket) -> int:
    _reply(sock, ready=os.getpid())
    while True:
        try:
            raw, fds, flags, _ = socket.recv_fds(sock, _MAX_MESSAGE, 3)
        except ConnectionError:
            return 0
        if not raw and not fds:
            return 0  # the platform closed its end
        try:
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                raise ValueError("the request was too large")
            if len(fds) != 3:
                raise ValueError(f"a request carries 3 file descriptors (stdin, stdout, stderr), not {len(fds)}")
            env, cgroups = _request(raw)
            pid = _spawn(sock, env, cgroups, fds)
        except (ValueError, OSError) as e:
            _reply(sock, error=str(e))
        else:
            _reply(sock, pid=pid)
        finally:
            for fd in fds:
                os.close(fd)


def main() -> int:
    raw = os.environ.pop(FD_ENV, "")
    if not raw.isdigit():
        sys.stderr.write(f"flatpack-zygote: {FD_ENV} must name the socket's file descriptor\n")
        return 2
    sock = socket.socket(fileno=int(raw))
    _preload()
    with sock:
        return serve(sock)


if __name__ == "__main__":
    sys.exit(main())

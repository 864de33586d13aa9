"""A function instance of the local platform: ``python -m functions.local_instance``.

The platform starts one process per instance with the function's ``FLATPACK_*`` environment and talks
to it over stdin/stdout with length-prefixed frames (the real stdout is moved to stderr first, so a
stray print cannot corrupt the protocol):

* instance -> platform, once: ``b"FPIR"``, u8 status (0 ready, 1 init failed), u64 length, JSON
  (``{"pid", "init_ms"}`` or ``{"errorType", "errorMessage"}``);
* platform -> instance, per request: u64 length, f64 when the platform handed it over (``time.monotonic()``,
  one clock for every process on the host), event bytes;
* instance -> platform, per request: u8 status (0 ok, 1 the reply carries an error), u64 length, f64 when it
  wrote the reply (``time.monotonic()``: the end of what the platform bills), reply.

The instance serves one request at a time and exits when stdin closes (the platform reaped it or died).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import struct
import sys
import time

from functions.settings import cpu_share, log_level

__all__ = ["main"]

READY = struct.Struct("<4sBQ")
REQUEST = struct.Struct("<Qd")
RESPONSE = struct.Struct("<BQd")
READY_MAGIC = b"FPIR"


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = os.readv(fd, [view[got:]])
        if k == 0:
            return None
        got += k
    return bytes(buf)


def _write_all(fd: int, *chunks: bytes) -> None:
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            k = os.write(fd, view)
            view = view[k:]


class _Dilation:
    """CPU share by dilation (the local platform's fallback where no cgroup can be written, and the top-up
    beside a cgroup's quota, see ``serving.platform.cpu``): after a piece of work that took ``cpu`` seconds
    of this process's CPU time, wait until its wall time is ``cpu / share``, as it would have been had the
    process been given ``share`` of a core all along.

    A request's wall time counts from when the platform handed it over (``since``), not from when this
    process got a core to read it: an instance owns its share from the moment its invocation arrives, as a
    Lambda instance owns its vCPU fraction. On a host with fewer cores than a split stage has parts, the
    parts invoked last waited for a core before they could read (6-10 ms for a 6-part vgg11/w2 stage at 512
    MB on 2 cores); counting from their own start charged that wait twice, once as the wait and again in
    the whole share-long top-up after it. A part still finishes no earlier than its CPU over its share
    after the hand-over, and no earlier than the host lets it."""

    def __init__(self, share: float | None) -> None:
        self.share = share
        self._wall = self._cpu = 0.0

    def start(self, since: float | None = None) -> None:
        now = time.monotonic()
        self._wall, self._cpu = (now if since is None else min(since, now)), time.process_time()

    def finish(self) -> None:
        if self.share is None:
            return
        owed = (time.process_time() - self._cpu) / self.share - (time.monotonic() - self._wall)
        if owed > 0:
            time.sleep(owed)


def main() -> int:
    out_fd = os.dup(1)
    os.dup2(2, 1)
    in_fd = 0
    logging.basicConfig(
        level=log_level(),
        format=f"%(levelname)s instance {os.getpid()} %(name)s: %(message)s",
    )
    t0 = time.perf_counter()
    dilation = _Dilation(cpu_share())
    dilation.start()
    try:
        from functions.config import FunctionConfig
        from functions.runtime import FunctionRuntime

        runtime = FunctionRuntime(FunctionConfig.from_env())
    except Exception as e:  # noqa: BLE001 - any init failure is reported to the platform, then we exit
        body = json.dumps({"errorType": "Runtime.InitError", "errorMessage": str(e)}).encode()
        _write_all(out_fd, READY.pack(READY_MAGIC, 1, len(body)), body)
        return 1
    # Everything loaded so far (numpy, onnxruntime, the sessions) lives as long as the instance: keep the
    # cyclic GC from walking it again and again (a full collection over it took ~4 ms every few requests).
    gc.collect()
    gc.freeze()
    dilation.finish()  # the cold start runs inside the share too
    body = json.dumps({"pid": os.getpid(), "init_ms": 1e3 * (time.perf_counter() - t0)}).encode()
    _write_all(out_fd, READY.pack(READY_MAGIC, 0, len(body)), body)
    try:
        while True:
            head = _read_exact(in_fd, REQUEST.size)
            if head is None:
                return 0
            n, handed_over = REQUEST.unpack(head)
            payload = _read_exact(in_fd, n)
            if payload is None:
                return 0
            dilation.start(since=handed_over)
            reply, failed = runtime.handle(payload)
            del payload
            dilation.finish()
            _write_all(out_fd, RESPONSE.pack(1 if failed else 0, len(reply), time.monotonic()), reply)
    finally:
        runtime.close()


if __name__ == "__main__":
    sys.exit(main())

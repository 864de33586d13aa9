"""The local platform's zygote: instances forked with numpy and onnxruntime already imported, which answer
as instances started as new interpreters do, in their own cgroups and environment, as the platform's own
children; and a zygote that fails or dies leaves the platform starting instances itself."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from functions.codec import decode, encode
from functions.event import Event, Reply, TensorEntry, now_ms
from functions.invoker.local import LocalInvoker
from functions.procstat import pid_alive
from functions.zygote import FD_ENV
from serving.platform.cpu import detect
from serving.platform.runtimes import project_pythonpath

pytest.importorskip("fastapi", reason="the platform tests need flatpack[server]")

from serving.platform import LocalPlatform, PlatformConfig  # noqa: E402
from serving.platform.deploy import Deployment, deploy_bundle  # noqa: E402

X = {"x": np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)}
Y = np.array([[0.0, 2.0, 0.0, 4.0]], np.float32)


def _invoke(p: LocalPlatform, d, name: str) -> np.ndarray:
    ev = Event("part", f"r{time.monotonic_ns()}", d.id, now_ms() + 30_000,
               tuple(TensorEntry(k, data=encode(v)) for k, v in X.items()), stage=0, part=0)
    reply = Reply.decode(LocalInvoker(p.url).invoke(d.names[name], ev.encode(), timeout_s=30))
    assert reply.error is None, reply.error
    return decode(reply.outputs[0].data)  # type: ignore[arg-type]


def _instance(p: LocalPlatform, name: str) -> dict:
    (inst,) = p.client.function(name)["instances"]
    return inst


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(kv.decode().split("=", 1) for kv in raw if b"=" in kv)


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _wait(predicate, what: str, timeout_s: float = 60.0):  # noqa: ANN001, ANN202 - a test helper
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = predicate()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"{what} within {timeout_s:.0f} s")


@contextlib.contextmanager
def _tiny_on(shm_root: Path, bundles, config: PlatformConfig | None = None,  # noqa: ANN001 - the fixture
             **deploy: object) -> Iterator[tuple[LocalPlatform, Deployment]]:
    """A local platform (``config``, default: whole cores) with the tiny bundle deployed on it, inline."""
    with LocalPlatform(config or PlatformConfig(port=0, shm_dir=shm_root, cpu_limit="off")) as p:
        d = deploy_bundle(p.client, bundles.tiny, shm_dir=shm_root, transport="inline", **deploy)  # type: ignore[arg-type]
        try:
            yield p, d
        finally:
            d.remove()


def test_a_forked_instance_answers_with_its_functions_environment_as_the_platforms_child(
        shm_root: Path, bundles) -> None:
    with _tiny_on(shm_root, bundles, memory_mb={"worker-1": 256}) as (p, d):
        np.testing.assert_array_equal(_invoke(p, d, "worker-1"), Y)
        inst = _instance(p, d.names["worker-1"])
        assert inst["forked"] is True
        zygote = p.client.health()["zygote"]
        assert zygote["spawned"] == 1 and zygote["failed"] is None and zygote["pid"]
        pid = inst["pid"]
        # the platform (this process: LocalPlatform runs in a thread) is its parent, not the zygote
        assert _ppid(pid) == os.getpid()
        # it served its bundle, which only its function's environment names (the zygote's has no FLATPACK_*)
        assert not any(k.startswith("FLATPACK_") for k in _environ(zygote["pid"]) if k != FD_ENV)
        assert os.getsid(pid) == pid  # its own session: a Ctrl-C at the platform's terminal does not reach it
        np.testing.assert_array_equal(_invoke(p, d, "worker-1"), Y)  # warm, same instance
        assert _instance(p, d.names["worker-1"])["invocations"] == 2


def test_a_forked_instance_killed_while_idle_is_reaped_and_the_next_request_gets_a_new_one(
        shm_root: Path, bundles) -> None:
    with _tiny_on(shm_root, bundles) as (p, d):
        _invoke(p, d, "worker-1")
        pid = _instance(p, d.names["worker-1"])["pid"]
        os.kill(pid, signal.SIGKILL)
        _wait(lambda: not pid_alive(pid), "the killed instance ended")
        # it died idle: the next request is served by a new forked instance, and the dead one was reaped
        np.testing.assert_array_equal(_invoke(p, d, "worker-1"), Y)
        inst = _instance(p, d.names["worker-1"])
        assert inst["pid"] != pid and inst["forked"]
        _wait(lambda: not Path(f"/proc/{pid}").exists(), "the killed instance reaped (no zombie left)")


@pytest.mark.skipif(detect("cgroup-v1") != "cgroup-v1", reason="no writable cgroup v1 here")
def test_a_forked_instance_runs_in_its_own_cgroups(shm_root: Path, bundles) -> None:
    config = PlatformConfig(port=0, shm_dir=shm_root, cpu_limit="cgroup-v1")
    with _tiny_on(shm_root, bundles, config, memory_mb={"worker-1": 512}) as (p, d):
        np.testing.assert_array_equal(_invoke(p, d, "worker-1"), Y)
        inst = _instance(p, d.names["worker-1"])
        assert inst["forked"]
        groups = Path(f"/proc/{inst['pid']}/cgroup").read_text().splitlines()
        mine = [g for g in groups if f"flatpack-{os.getpid()}/{d.names['worker-1'][:100]}-" in g]
        controllers = {c for g in mine for c in g.split(":")[1].split(",")}
        assert {"cpu", "memory"} <= controllers, groups


def test_a_dead_zygote_is_started_again_and_one_that_cannot_start_leaves_instances_to_new_processes(
        shm_root: Path, bundles) -> None:
    with _tiny_on(shm_root, bundles) as (p, d):
        _invoke(p, d, "worker-1")
        first = p.client.health()["zygote"]["pid"]
        pid = _instance(p, d.names["worker-1"])["pid"]
        os.kill(first, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
        _wait(lambda: not pid_alive(pid), "the killed instance ended")
        np.testing.assert_array_equal(_invoke(p, d, "worker-1"), Y)
        zygote = p.client.health()["zygote"]
        assert zygote["pid"] not in (None, first) and _instance(p, d.names["worker-1"])["forked"]
    with LocalPlatform(PlatformConfig(port=0, shm_dir=shm_root, cpu_limit="off")) as p:
        assert p.service.zygote is not None
        p.service.zygote.python = "/no/such/python"  # the zygote cannot start: instances start as new processes
        d = deploy_bundle(p.client, bundles.tiny, shm_dir=shm_root, transport="inline")
        try:
            np.testing.assert_array_equal(_invoke(p, d, "worker-1"), Y)
            assert _instance(p, d.names["worker-1"])["forked"] is False
            assert "/no/such/python" in p.client.health()["zygote"]["failed"]
        finally:
            d.remove()


def test_a_zygote_that_drops_a_request_is_replaced_and_the_instance_still_forked(shm_root: Path, bundles) -> None:
    """A zygote killed a moment before a request can still look alive and then drop it: the platform starts
    another and forks the instance from that one, rather than falling back to a new process (a CI run on a
    loaded machine saw the killed zygote's successor missing). Here the zygote is stopped (alive, answering
    nothing) and the platform's end of its socket shut, which drops the request the same way, every time."""
    with _tiny_on(shm_root, bundles) as (p, d):
        _invoke(p, d, "worker-1")
        zygote = p.service.zygote
        assert zygote is not None and zygote._sock is not None
        first = zygote.pid
        pid = _instance(p, d.names["worker-1"])["pid"]
        assert first is not None
        os.kill(first, signal.SIGSTOP)
        zygote._sock.shutdown(socket.SHUT_RDWR)
        os.kill(pid, signal.SIGKILL)
        _wait(lambda: not pid_alive(pid), "the killed instance ended")
        np.testing.assert_array_equal(_invoke(p, d, "worker-1"), Y)
        assert zygote.pid not in (None, first) and zygote.failed is None
        assert _instance(p, d.names["worker-1"])["forked"]


def test_the_platform_can_be_told_to_start_every_instance_as_a_new_process(shm_root: Path, bundles) -> None:
    config = PlatformConfig.from_env({"FLATPACK_PLATFORM_ZYGOTE": "0"}, port=0, shm_dir=shm_root, cpu_limit="off")
    with _tiny_on(shm_root, bundles, config) as (p, d):
        np.testing.assert_array_equal(_invoke(p, d, "worker-1"), Y)
        assert _instance(p, d.names["worker-1"])["forked"] is False and p.client.health()["zygote"] is None


@pytest.fixture
def zygote():  # noqa: ANN201 - a test fixture
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    env = {**os.environ, FD_ENV: str(theirs.fileno()), "PYTHONPATH": project_pythonpath()}
    proc = subprocess.Popen([sys.executable, "-m", "functions.zygote"], env=env, pass_fds=[theirs.fileno()])
    theirs.close()
    ours.settimeout(120)
    assert "ready" in json.loads(ours.recv(4096))
    yield proc, ours
    ours.close()
    proc.wait(30)


def test_the_zygote_refuses_a_malformed_request_and_serves_the_next(zygote) -> None:
    proc, sock = zygote
    sock.send(b'{"env": {}}')  # no pipes
    assert "3 file descriptors" in json.loads(sock.recv(4096))["error"]
    r, w = os.pipe()
    try:
        socket.send_fds(sock, [b'{"env": {"A": 1}}'], [r, w, w])  # a number where a string belongs
        assert "env" in json.loads(sock.recv(4096))["error"]
        socket.send_fds(sock, [b"not json"], [r, w, w])
        assert "error" in json.loads(sock.recv(4096))
    finally:
        os.close(r)
        os.close(w)
    assert proc.poll() is None  # still serving
    # and a good request still gets an instance (which exits at once: its stdin is closed)
    rin, win = os.pipe()
    rout, wout = os.pipe()
    os.close(win)
    try:
        socket.send_fds(sock, [json.dumps({"env": {"PYTHONPATH": project_pythonpath()}}).encode()], [rin, wout, wout])
        assert json.loads(sock.recv(4096))["pid"] > 0
    finally:
        for fd in (rin, rout, wout):
            os.close(fd)
    # the platform closes its end: the zygote exits
    sock.close()
    assert proc.wait(30) == 0


def test_no_other_process_can_reach_the_zygote(shm_root: Path, bundles) -> None:
    """The attack: another local user connects to the zygote and has it fork a process into the platform's
    cgroups with an environment of their choosing. There is nothing to connect to: its only socket is one end
    of a socket pair, with no address on the file system or in the abstract namespace."""
    with _tiny_on(shm_root, bundles) as (p, d):
        _invoke(p, d, "worker-1")
        zpid = p.client.health()["zygote"]["pid"]
        inodes = set()
        for fd in Path(f"/proc/{zpid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
        assert inodes, "the zygote holds its socket"
        named = {}
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            f = line.split()
            if f[6] in inodes:
                named[f[6]] = f[7] if len(f) > 7 else ""
        assert set(named) == inodes and not any(named.values()), named
        # nor does it listen: a SOCK_SEQPACKET pair is connected from birth (state 03, SS_CONNECTED)


def test_bench_coldstart_compares_forked_and_new_interpreter_starts_in_one_run() -> None:
    from bench.components.coldstart import measure

    result = measure(rounds=1, starts=2, requests=2, size=64, layers=1, cpu_limit="off")
    doc = result.to_json()
    assert [r["arm"] for r in doc["rows"]] == ["zygote", "exec"]
    assert all(r["starts"] == 2 and r["quiet_p50_ms"] > 0 and r["beside_p95_ms"] > 0 for r in doc["rows"])
    # CPU, not wall time: a forked instance does not import numpy and onnxruntime again
    assert doc["start_cpu_ratio"] < 1.0

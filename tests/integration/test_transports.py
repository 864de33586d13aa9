"""Transports against the real stores: shared memory (tmpfs), Redis (a real server), S3 (moto's server)."""

from __future__ import annotations

import gc
import os
import socket
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from functions.codec import read_header
from functions.errors import BadRequest, PayloadTooLarge, TransportError
from functions.transport import TensorChannel, TensorKey, Transport, TransportSet
from functions.transport.shm import ShmTransport, _size_class


@pytest.fixture(params=["shm", "redis", "s3"])
def store(request: pytest.FixtureRequest, shm_root: Path) -> Iterator[Transport]:
    if request.param == "shm":
        t: Transport = ShmTransport(shm_root)
    elif request.param == "redis":
        from functions.transport.redis import RedisTransport

        t = RedisTransport(request.getfixturevalue("redis_url"), ttl_s=60)
    else:
        from functions.transport.s3 import S3Transport

        t = S3Transport("flatpack-tensors", endpoint_url=request.getfixturevalue("s3_endpoint"))
    yield t
    t.close()


def _dep() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def test_put_get_delete(store: Transport) -> None:
    dep = _dep()
    a = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    ref = store.put(TensorKey(dep, "r1", "x"), a)
    assert ref == f"{store.scheme}:{dep}/r1/x"
    np.testing.assert_array_equal(store.get(ref), a)
    assert store.count(dep) == 1
    store.delete([ref])
    assert store.count(dep) == 0
    store.delete([ref])  # already gone: fine
    with pytest.raises(TransportError, match=f"{dep}/r1/x"):
        store.get(ref)


def test_delete_after_read_and_purge(store: Transport) -> None:
    dep = _dep()
    refs = [store.put(TensorKey(dep, r, f"t{i}"), np.full((3,), i, np.int64)) for r in ("a", "b") for i in range(2)]
    assert store.count(dep) == 4
    np.testing.assert_array_equal(store.get(refs[0], delete=True), [0, 0, 0])
    assert store.count(dep) == 3
    assert store.purge(dep, "a") == 1
    assert store.count(dep) == 2
    assert store.purge(dep) == 2
    assert store.count(dep) == 0


def test_discard_removes_a_request_now_and_what_it_stores_later(store: Transport) -> None:
    dep = _dep()
    big = np.ones(1 << 18, np.float32)  # 1 MB: recycled files on shared memory, the other path there
    store.put(TensorKey(dep, "dead", "a"), big)
    store.put(TensorKey(dep, "dead", "b"), np.ones(3, np.float32))
    kept = store.put(TensorKey(dep, "alive", "a"), np.ones(3, np.float32))
    assert store.discard(dep, "dead") == 2
    assert store.count(dep) == 1
    # a worker of the abandoned request that finishes afterwards: its tensors are dropped as they are stored
    for name, x in (("c", big), ("d", np.zeros(2, np.int64))):
        late = store.put(TensorKey(dep, "dead", name), x)
        with pytest.raises(TransportError):
            store.get(late)
    assert store.count(dep) == 1
    # other requests are untouched, before and after
    np.testing.assert_array_equal(store.get(kept, delete=True), np.ones(3, np.float32))
    ref = store.put(TensorKey(dep, "later", "a"), big)
    np.testing.assert_array_equal(store.get(ref, delete=True), big)
    assert store.count(dep) == 0
    store.purge(dep)


def test_shm_discard_unlinks_files_held_by_a_dead_process(shm_root: Path) -> None:
    t = ShmTransport(shm_root)
    dep = _dep()
    t.put(TensorKey(dep, "r", "a"), np.ones(3, np.float32))  # creates the directories
    held = shm_root / dep / ".held"
    dead_pid = _a_dead_pid()
    (held / f"{dead_pid}-deadbeef-0").write_bytes(b"x")  # what a killed reader leaves for recycling
    mine = held / f"{os.getpid()}-cafe0000-0"
    mine.write_bytes(b"x")
    t.discard(dep, "r")
    assert sorted(p.name for p in held.iterdir()) == [mine.name]
    t.purge(dep)


def _a_dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])  # noqa: S603 - our own interpreter
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("compression", ["none", "zstd", "lz4"])
def test_compressed_and_big(store: Transport, compression: str) -> None:
    dep = _dep()
    a = np.zeros((1, 64, 64, 64), np.float32)  # 1 MB, very compressible
    a[0, ::3] = 2.0
    ref = store.put(TensorKey(dep, "r", "big"), a, compression=compression)  # type: ignore[arg-type]
    np.testing.assert_array_equal(store.get(ref, delete=True), a)
    assert store.count(dep) == 0


def test_concurrent_requests_do_not_collide(store: Transport) -> None:
    from concurrent.futures import ThreadPoolExecutor

    dep = _dep()

    def one(i: int) -> bool:
        a = np.full((16, 16), i, np.float32)
        ref = store.put(TensorKey(dep, f"req{i}", "y"), a)
        return bool(np.array_equal(store.get(ref, delete=True), a))

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(one, range(32)))
    assert store.count(dep) == 0


@pytest.mark.parametrize("bad", [("../etc", "r", "x"), ("d", "r/..", "x"), ("d", "r", "a/b"), ("d", "r", ".hidden"),
                                 ("d", "", "x"), ("d" * 65, "r", "x")])
def test_keys_are_checked(bad: tuple[str, str, str]) -> None:
    with pytest.raises(BadRequest):
        TensorKey(*bad)


def test_a_ref_cannot_escape_the_shm_root(shm_root: Path) -> None:
    t = ShmTransport(shm_root)
    for ref in ("shm:../../etc/passwd", "shm:a/b/../../c", "shm:/etc/passwd"):
        with pytest.raises(BadRequest):
            t.get(ref)
    with pytest.raises(BadRequest, match="belongs to transport"):
        t.get("redis:a/b/c")


# -- shared memory specifics ------------------------------------------------------------------------------


def test_shm_files_are_private_and_reads_zero_copy(shm_root: Path) -> None:
    t = ShmTransport(shm_root)
    dep = _dep()
    a = np.arange(1 << 16, dtype=np.float32)
    ref = t.put(TensorKey(dep, "r", "x"), a)
    path = shm_root / dep / "r.x"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((shm_root / dep).stat().st_mode) == 0o700
    b = t.get(ref)
    assert not b.flags.owndata and not b.flags.writeable  # a view of the mapped file
    np.testing.assert_array_equal(b, a)
    c = t.get(ref, delete=True)
    assert not path.exists()  # the name goes at once; the mapping keeps the data
    np.testing.assert_array_equal(c, a)
    t.purge(dep)


def test_shm_recycles_files_only_after_readers_let_go(shm_root: Path) -> None:
    t = ShmTransport(shm_root)
    dep = _dep()
    size = 1 << 20
    first = np.full(size // 4, 1.0, np.float32)
    held = t.get(t.put(TensorKey(dep, "r", "a"), first), delete=True)
    # while `held` lives its file is not reused: later puts of the same size class land elsewhere
    for i in range(3):
        t.get(t.put(TensorKey(dep, "r", f"b{i}"), np.full(size // 4, 2.0 + i, np.float32)), delete=True)
    np.testing.assert_array_equal(held, first)
    free = shm_root / dep / ".free" / str(_size_class(size + 64))
    n_free = len(os.listdir(free))
    assert n_free >= 1
    del held
    gc.collect()
    assert len(os.listdir(free)) == n_free + 1
    # a recycled file is reused by the next put of that class, and holds exactly the new tensor
    x = np.random.default_rng(5).standard_normal(size // 4 - 100).astype(np.float32)
    ref = t.put(TensorKey(dep, "r", "c"), x)
    assert len(os.listdir(free)) == n_free
    np.testing.assert_array_equal(t.get(ref, delete=True), x)
    assert t.count(dep) == 0
    t.purge(dep)
    assert not (shm_root / dep).exists()


def test_shm_size_classes() -> None:
    for n in (1, 64 << 10, (4 << 20) + 64, 3 * (1 << 20) + 64, 5_000_000, (64 << 20) + 64):
        c = _size_class(n)
        assert c >= n and (c - 4096 <= 1.25 * max(n, 64 << 10))


def test_shm_sweeper_removes_stale_files(shm_root: Path) -> None:
    t = ShmTransport(shm_root)
    dep = _dep()
    t.put(TensorKey(dep, "old", "x"), np.zeros(8, np.float32))
    t.put(TensorKey(dep, "new", "x"), np.zeros(8, np.float32))
    past = time.time() - 3600
    os.utime(shm_root / dep / "old.x", (past, past))
    assert t.sweep(max_age_s=600) == 1
    assert t.count(dep) == 1
    t.purge(dep)


# -- Redis specifics --------------------------------------------------------------------------------------


def test_redis_keys_carry_ids_and_a_ttl(redis_url: str) -> None:
    import redis

    from functions.transport.redis import RedisTransport

    t = RedisTransport(redis_url, ttl_s=42)
    dep = _dep()
    ref = t.put(TensorKey(dep, "req7", "s0p1a0.o0"), np.ones(4, np.float32))
    raw = redis.Redis.from_url(redis_url)
    assert raw.exists(f"flatpack:{dep}:req7:s0p1a0.o0")
    assert 0 < t.ttl_of(ref) <= 42
    assert read_header(raw.get(f"flatpack:{dep}:req7:s0p1a0.o0")).shape == (4,)
    t.get(ref, delete=True)
    assert t.ttl_of(ref) == -2
    t.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_redis_is_a_clear_error_not_a_hang() -> None:
    from functions.transport.redis import RedisTransport

    url = f"redis://:sekrit@127.0.0.1:{_closed_port()}/0"
    t = RedisTransport(url)
    t0 = time.monotonic()
    with pytest.raises(TransportError) as info:
        t.put(TensorKey("d", "r", "x"), np.zeros(3, np.float32))
    assert time.monotonic() - t0 < 5
    msg = str(info.value)
    assert "unreachable" in msg and "127.0.0.1" in msg and "FLATPACK_REDIS_URL" in msg
    assert "sekrit" not in msg  # the password is redacted
    with pytest.raises(TransportError):
        t.get("redis:d/r/x")
    with pytest.raises(TransportError):
        t.ping()


# -- the channel: inline vs by reference -----------------------------------------------------------------


def test_inline_channel_falls_back_above_the_payload_limit(shm_root: Path) -> None:
    ts = TransportSet.of(ShmTransport(shm_root))
    dep = _dep()
    ch = TensorChannel(ts, transport="inline", fallback="shm", payload_limit_bytes=64 * 1024)
    small, big = np.ones(100, np.float32), np.ones(20_000, np.float32)  # 400 B, 80 KB
    entries = ch.send({"small": small, "big": big}, lambda n: TensorKey(dep, "r", n))
    kinds = {e.name: ("ref" if e.ref else "inline") for e in entries}
    assert kinds == {"small": "inline", "big": "ref"}
    back = ch.receive(entries, delete=True)
    np.testing.assert_array_equal(back["big"], big)
    np.testing.assert_array_equal(back["small"], small)
    assert ts.transport("shm").count(dep) == 0


def test_json_wire_budget_counts_base64(shm_root: Path) -> None:
    ts = TransportSet.of(ShmTransport(shm_root))
    x = {"x": np.ones(14_000, np.float32)}  # 56 KB raw, 75 KB as base64
    key = lambda n: TensorKey(_dep(), "r", n)  # noqa: E731
    assert TensorChannel(ts, transport="inline", fallback="shm", payload_limit_bytes=70_000,
                         wire="binary").send(x, key)[0].data is not None
    e = TensorChannel(ts, transport="inline", fallback="shm", payload_limit_bytes=70_000, wire="json").send(x, key)[0]
    assert e.ref is not None
    ts.delete([e.ref])


def test_inline_without_fallback_says_what_to_do(shm_root: Path) -> None:
    ch = TensorChannel(TransportSet.of(), transport="inline", fallback=None, payload_limit_bytes=1000)
    with pytest.raises(PayloadTooLarge, match="FLATPACK_FALLBACK_TRANSPORT"):
        ch.send({"x": np.ones(1000, np.float32)}, lambda n: TensorKey("d", "r", n))


def test_reference_channel_and_regions(shm_root: Path) -> None:
    ts = TransportSet.of(ShmTransport(shm_root))
    dep = _dep()
    ch = TensorChannel(ts, transport="shm", inline_max_bytes=64)
    a = np.arange(48, dtype=np.float32).reshape(1, 3, 4, 4)
    entries = ch.send({"tiny": np.ones(4, np.float32), "a": a}, lambda n: TensorKey(dep, "r", n))
    assert entries[0].data is not None and entries[1].ref is not None
    assert entries[1].shape == (1, 3, 4, 4) and entries[1].dtype == "float32"
    from functions.event import TensorEntry

    region = ((0, 1), (1, 3), (0, 2), (1, 4))
    got = ch.receive([TensorEntry("a", ref=entries[1].ref, region=region)])
    np.testing.assert_array_equal(got["a"], a[0:1, 1:3, 0:2, 1:4])
    with pytest.raises(BadRequest, match="does not fit"):
        ch.receive([TensorEntry("a", ref=entries[1].ref, region=((0, 1), (0, 9), (0, 4), (0, 4)))])
    ts.delete([entries[1].ref])


def test_transport_set_routes_by_scheme(shm_root: Path) -> None:
    ts = TransportSet.of(ShmTransport(shm_root))
    with pytest.raises(BadRequest, match="no 'redis' transport"):
        ts.get("redis:a/b/c")
    with pytest.raises(BadRequest, match="no scheme"):
        ts.get("a/b/c")


def test_redis_with_a_password(tmp_path: Path) -> None:
    import shutil
    import subprocess

    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("needs redis-server on PATH to start a password-protected one")
    from functions.transport.redis import RedisTransport

    port = _closed_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--requirepass", "s3cret", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        good = RedisTransport(f"redis://:s3cret@127.0.0.1:{port}/2")
        for _ in range(100):
            try:
                good.ping()
                break
            except TransportError:
                time.sleep(0.05)
        a = np.arange(1 << 18, dtype=np.float32)
        ref = good.put(TensorKey("d", "r", "x"), a)
        np.testing.assert_array_equal(good.get(ref, delete=True), a)
        assert good.count("d") == 0
        with pytest.raises(TransportError, match="answered") as info:
            RedisTransport(f"redis://:wrong@127.0.0.1:{port}/0").put(TensorKey("d", "r", "x"), a)
        assert "wrong" not in str(info.value)
    finally:
        proc.terminate()
        proc.wait(timeout=10)

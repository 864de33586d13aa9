"""The local platform's function pool: instances started on demand up to the concurrency limit, reused
while warm, throttled beyond the limit, reaped when idle or dead, stopped on close.

Real instance processes (``python -m functions.local_instance``) of a one-part bundle; no platform server
around them. Idleness is set on the instance (``last_used``) rather than waited for.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest

from functions.codec import decode, encode
from functions.config import FunctionConfig
from functions.event import Event, Reply, TensorEntry, now_ms
from platforms import load_profile
from serving.platform.errors import TooManyRequests
from serving.platform.instance import instance_argv
from serving.platform.meter import Meter
from serving.platform.pool import FunctionPool
from serving.platform.runtimes import project_pythonpath
from serving.platform.spec import FunctionSpec

X = np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)


def _pool(bundle: Path, *, concurrency: int, queue_timeout_s: float | None = None) -> tuple[FunctionPool, Meter]:
    cfg = FunctionConfig(bundle_dir=bundle, deployment="pool", function="worker-1", transport="inline")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FLATPACK_")}, **cfg.to_env(),
           "PYTHONPATH": project_pythonpath(), "FLATPACK_INTRA_OP_THREADS": "1"}
    meter = Meter(load_profile("local"))
    spec = FunctionSpec("pool-worker-1", 512, queue_timeout_s=queue_timeout_s)
    pool = FunctionPool(spec, argv=instance_argv(sys.executable), env=env, concurrency=concurrency,
                        timeout_s=60, init_timeout_s=60, meter=meter)
    return pool, meter


def _payload(request_id: str) -> bytes:
    return Event("part", request_id, "pool", now_ms() + 60_000, (TensorEntry("x", data=encode(X)),),
                 stage=0, part=0).encode()


def _cold_starts(meter: Meter) -> int:
    return int(meter.snapshot()["total"].get("cold_starts", 0))  # type: ignore[union-attr]


def _run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


async def _invoke(pool: FunctionPool, request_id: str) -> None:
    reply = await pool.invoke(_payload(request_id))
    assert not reply.failed
    np.testing.assert_array_equal(decode(Reply.decode(reply.body).outputs[0].data), np.maximum(X, 0))  # type: ignore[arg-type]


def test_requests_at_once_start_instances_up_to_the_limit_then_reuse_them(bundles) -> None:
    async def test() -> None:
        pool, meter = _pool(bundles.tiny, concurrency=2)
        try:
            await asyncio.gather(_invoke(pool, "a"), _invoke(pool, "b"))  # both find no idle instance
            assert len(pool.instances) == 2 and not pool.busy and _cold_starts(meter) == 2
            pids = {i.pid for i in pool.instances}
            await asyncio.gather(*(_invoke(pool, f"c{k}") for k in range(4)))  # 4 requests, 2 warm instances
            assert {i.pid for i in pool.instances} == pids and _cold_starts(meter) == 2
            assert sum(i.invocations for i in pool.instances) == 6
        finally:
            await pool.close()

    _run(test)


def test_a_request_beyond_the_limit_is_throttled_when_it_may_not_wait(bundles) -> None:
    async def test() -> None:
        pool, meter = _pool(bundles.tiny, concurrency=1, queue_timeout_s=0)
        try:
            results = await asyncio.gather(_invoke(pool, "a"), _invoke(pool, "b"), return_exceptions=True)
            assert results[0] is None and isinstance(results[1], TooManyRequests), results
            assert "concurrency limit (1 instances" in str(results[1])
            assert meter.snapshot()["functions"]["pool-worker-1"]["errors_by_type"] == {"Throttled": 1}  # type: ignore[index]
            await _invoke(pool, "c")  # the instance is free again
            assert len(pool.instances) == 1
        finally:
            await pool.close()

    _run(test)


def test_instances_idle_past_the_timeout_or_dead_are_reaped(bundles) -> None:
    async def test() -> None:
        pool, meter = _pool(bundles.tiny, concurrency=3)
        try:
            await asyncio.gather(*(_invoke(pool, k) for k in "abc"))
            old, dead, recent = sorted(pool.idle, key=lambda i: i.id)
            old.last_used -= 100  # idle for 100 s
            assert await pool.reap(idle_timeout_s=50) == 1
            assert old not in pool.instances and not old.alive
            dead.kill()
            deadline = time.monotonic() + 30
            while dead.alive and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert await pool.reap(idle_timeout_s=50) == 1
            assert pool.instances == [recent] and recent.alive
            await _invoke(pool, "d")  # served by the one left, warm
            assert _cold_starts(meter) == 3
        finally:
            await pool.close()
        assert not pool.instances and not recent.alive
        with pytest.raises(TooManyRequests, match="being removed"):
            await pool.invoke(_payload("e"))

    _run(test)


def test_prewarm_starts_instances_up_to_the_count_and_the_limit(bundles) -> None:
    async def test() -> None:
        pool, meter = _pool(bundles.tiny, concurrency=3)
        try:
            assert await pool.prewarm(5) == 3  # the concurrency limit bounds provisioned instances too
            assert len(pool.idle) == 3 and _cold_starts(meter) == 3 and pool.spares_started == 3
            assert not pool.recovering()
            assert await pool.prewarm(2) == 0
            await asyncio.gather(*(_invoke(pool, k) for k in "abc"))  # all served warm
            assert _cold_starts(meter) == 3
        finally:
            await pool.close()

    _run(test)


def test_an_instance_found_dead_is_replaced_once(bundles) -> None:
    async def test() -> None:
        pool, meter = _pool(bundles.tiny, concurrency=4)
        try:
            await _invoke(pool, "a")
            (inst,) = pool.idle
            assert pool.spares_wanted() == 0  # no death yet: Lambda's semantics, nothing started ahead
            inst.kill()
            deadline = time.monotonic() + 30
            while inst.alive and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await _invoke(pool, "b")  # finds it dead: one instance started in its place
            assert pool.recovering()
            assert _cold_starts(meter) == 2 and len(pool.instances) == 1
        finally:
            await pool.close()

    _run(test)


def test_an_invocation_is_billed_until_its_instance_replied_not_until_the_platform_read_it(bundles) -> None:
    """Lambda bills a function from its invocation to its reply. The platform's loop may read a reply late (it
    forwards other invocations meanwhile); that delay is not the function's. Here the loop is held up once the
    reply is in the pipe: the bill still ends no later than the moment the reply was seen there."""
    import select

    from serving.platform.instance import Instance

    async def test() -> None:
        pool, _ = _pool(bundles.tiny, concurrency=1)
        inst = Instance(pool.spec.name, pool.spec.memory_mb, pool._argv, pool._env)
        await inst.start(60)
        try:
            assert inst.proc is not None
            pipe = inst.proc._transport.get_pipe_transport(1).get_extra_info("pipe")  # type: ignore[attr-defined]
            before = time.monotonic()
            task = asyncio.create_task(inst.invoke(_payload("late-read"), 60))
            await asyncio.sleep(0)  # the request is written; the reply is awaited
            deadline = time.monotonic() + 60
            while not select.select([pipe], [], [], 0.01)[0]:  # the loop is held: nothing reads the reply
                assert time.monotonic() < deadline, "no reply"
            ready = time.monotonic()
            time.sleep(0.3)  # the platform's loop busy elsewhere while the reply waits
            reply = await task
            assert not reply.failed
            assert 0 < reply.duration_ms <= 1e3 * (ready - before)
        finally:
            await inst.stop()

    _run(test)


def test_a_reply_stamp_outside_the_exchange_leaves_the_bill_at_the_platforms_own_timing() -> None:
    from serving.platform.instance import billed_duration_ms

    assert billed_duration_ms(10.0, 10.004, 6.0) == pytest.approx(4.0)
    assert billed_duration_ms(10.0, 9.0, 6.0) == 6.0  # before the hand-over
    assert billed_duration_ms(10.0, 10.5, 6.0) == 6.0  # after the platform read it

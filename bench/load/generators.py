"""Load generators: closed loops, open loops (arrivals sent on time), interleaved comparisons.

Every request becomes a :class:`bench.load.latency.Sample`, failures included: an exception is counted in
its sample, never dropped.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from bench.load.inputs import InputPool
from bench.load.latency import Sample
from bench.load.targets import Target

__all__ = ["alternate", "closed_loop", "open_loop"]


def _one(target: Target, pool: InputPool, i: int, client: int, due: float, t0: float, label: str) -> Sample:
    sent = time.perf_counter()
    try:
        out = target.infer(pool.inputs[i % len(pool)])
    except Exception as e:  # noqa: BLE001 - every failure is counted in the sample, never dropped
        done = time.perf_counter()
        return Sample(i, client, due, sent - t0, 1e3 * (done - t0 - due), 1e3 * (done - sent),
                      error=f"{type(e).__name__}: {e}"[:500], label=label)
    done = time.perf_counter()
    correct, err = pool.check(i, out)
    return Sample(i, client, due, sent - t0, 1e3 * (done - t0 - due), 1e3 * (done - sent), None, correct, err, label)


def closed_loop(target: Target, pool: InputPool, *, clients: int, requests: int, label: str = "",
                first_index: int = 0, progress: Callable[[int], None] | None = None, think_s: float = 0.0
                ) -> tuple[list[Sample], float]:
    """``clients`` threads, each sending ``requests`` requests back to back (pausing ``think_s`` after each
    response: an interactive user's think time). Returns (samples, wall s)."""
    if clients < 1 or requests < 0:
        raise ValueError(f"need clients >= 1 and requests >= 0, got {clients} and {requests}")
    samples: list[Sample] = []
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)
    t0_box: list[float] = []

    def client(c: int) -> None:
        start.wait()
        t0 = t0_box[0]
        for r in range(requests):
            i = first_index + c * requests + r
            s = _one(target, pool, i, c, time.perf_counter() - t0, t0, label)
            with lock:
                samples.append(s)
            if progress:
                progress(1)
            if think_s > 0:
                time.sleep(think_s)

    threads = [threading.Thread(target=client, args=(c,), name=f"flatpack-load-{c}", daemon=True)
               for c in range(clients)]
    for t in threads:
        t.start()
    t0_box.append(time.perf_counter())
    start.wait()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0_box[0]
    samples.sort(key=lambda s: s.due_s)
    return samples, wall


def open_loop(target: Target, pool: InputPool, arrivals: Sequence[float], *, max_inflight: int = 64,
              label: str = "", first_index: int = 0, progress: Callable[[int], None] | None = None
              ) -> tuple[list[Sample], float]:
    """One request per arrival offset (s), sent on time by a pool of ``max_inflight`` sender threads.

    A request that finds every sender busy waits for one, and its latency counts from its arrival."""
    samples: list[Sample] = []
    lock = threading.Lock()

    def send(i: int, due: float, t0: float) -> None:
        s = _one(target, pool, first_index + i, -1, due, t0, label)
        with lock:
            samples.append(s)
        if progress:
            progress(1)

    with ThreadPoolExecutor(max_workers=max(1, max_inflight), thread_name_prefix="flatpack-open") as ex:
        t0 = time.perf_counter()
        for i, due in enumerate(arrivals):
            delay = t0 + due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            ex.submit(send, i, float(due), t0)
    wall = time.perf_counter() - t0
    samples.sort(key=lambda s: s.due_s)
    return samples, wall


def alternate(targets: Mapping[str, Target], pool: InputPool, *, rounds: int, block: int = 1,
              order: random.Random | None = None,
              progress: Callable[[int], None] | None = None) -> dict[str, list[Sample]]:
    """Interleaved sequential requests for a same-run comparison: in each round every target gets
    ``block`` requests, one at a time. Arm k's request j uses the same input as every other arm's request j.

    The order within a round is rotated every round (neither arm always goes first), or with ``order``
    drawn afresh from it every round. A rotation keeps the arms' cyclic order, so each arm follows the same
    one in all but one round of every cycle: on a small host a request runs in what its predecessor left
    behind (caches, a process just back from idle), and two identical deployments can then bill apart by
    more than a model's error. A random order gives every arm every predecessor alike."""
    names = list(targets)
    out: dict[str, list[Sample]] = {n: [] for n in names}
    t0 = time.perf_counter()
    for r in range(rounds):
        if order is not None:
            this = order.sample(names, len(names))
        else:
            this = names[r % len(names):] + names[: r % len(names)]
        for name in this:
            for b in range(block):
                i = r * block + b
                out[name].append(_one(targets[name], pool, i, 0, time.perf_counter() - t0, t0, name))
                if progress:
                    progress(1)
    return out

"""The deployments one comparison makes on the platform process (removed at its end), and the interleaved
rounds of requests over them."""

from __future__ import annotations

import contextlib
import math
import random
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from bench.load.generators import alternate, closed_loop
from bench.load.inputs import InputPool
from bench.load.latency import Sample
from bench.load.targets import DeploymentTarget, Target
from bench.load.usage import UsageSummary, add_deltas, meter_delta, usage_summary

__all__ = ["Deployments", "deployments", "interleaved", "mean_uncertainty"]


class Deployments:
    """Deployments and targets made during one comparison, removed at its end (:func:`deployments`)."""

    def __init__(self, pp: Any) -> None:
        self.pp = pp
        self.deps: list[Any] = []
        self.targets: list[Any] = []
        self._made: list[tuple[Path, str, dict[str, Any]]] = []
        self.restarts = 0  # how many times :meth:`restart` ran

    def deploy(self, bundle: Path, name: str, *, keep_timings: bool = False, **kw: Any) -> DeploymentTarget:
        from serving.platform.deploy import deploy_bundle, new_deployment_id

        dep = deploy_bundle(self.pp.client, bundle, deployment=new_deployment_id(f"{name}-"), **kw)
        self.deps.append(dep)
        self._made.append((bundle, dep.id, kw))
        t = DeploymentTarget(dep, self.pp.url, name=name, keep_timings=keep_timings)
        self.targets.append(t)
        return t

    def restart(self) -> None:
        """Deploy everything deployed here again, each under its own id and names: the platform stops each
        function's instances and the next request starts new ones (new processes), its meter rows kept. Two
        processes of one function differ in speed by a few per cent that stays with the process (measured: 3-6 %
        at one vCPU, up to 12 % below it), so a comparison that restarts its functions between epochs of
        rounds averages that over several processes on each side (:func:`interleaved`)."""
        from serving.platform.deploy import deploy_bundle

        for bundle, dep, kw in self._made:
            deploy_bundle(self.pp.client, bundle, deployment=dep, **kw)
        self.restarts += 1

    def add(self, target: Any) -> Any:
        self.targets.append(target)
        return target

    def close(self) -> None:
        for t in self.targets:
            with contextlib.suppress(Exception):
                t.close()
        for d in self.deps:
            with contextlib.suppress(Exception):
                d.remove()


@contextlib.contextmanager
def deployments(pp: Any) -> Iterator[Deployments]:
    """``with deployments(pp) as st: st.deploy(...)``: everything deployed in the block is removed after it."""
    s = Deployments(pp)
    try:
        yield s
    finally:
        s.close()


def interleaved(targets: Mapping[str, Target], pool: InputPool, rounds: int, *, warmup: int = 3, burst: int = 1,
                precision: float = 0.0, max_rounds: int | None = None, watched: Sequence[str] | None = None,
                epochs: int = 1, restart: Callable[[], None] | None = None, seed: int | None = None,
                ) -> tuple[dict[str, list[Sample]], dict[str, UsageSummary], float]:
    """Warm every target up, then ``rounds`` interleaved rounds; samples, meter usage per target, wall s.

    ``burst`` > 1: the warm-up first sends each target that many requests at once (twice), so that every
    function holds that many warm instances, as a service that has seen that much concurrency does. A split
    plan hedges its stragglers (after 20 calls of a part, past their p95); with one instance per function
    each first hedge starts one, cold, inside the measured rounds, and on a small host every instance's
    cold start takes CPU from the request being timed.

    ``precision`` > 0: after the first ``rounds``, ``rounds`` more at a time while some target's mean latency
    is less certain than that (:func:`mean_uncertainty`), up to ``max_rounds`` in all (default: ``rounds``).
    A comparison of means (a meter's billed time per request) then rests on as many requests as each run's
    spread needs: on a shared host the odd request that waits out a busy moment moves a short run's mean by
    more than a model's error. ``watched``: the targets whose means must be known that well (default: all;
    a probe timed beside the plans need not be). Every target gets the same rounds; the usage is over all of
    them.

    ``epochs`` > 1 with ``restart`` (:meth:`Deployments.restart`): the first ``rounds`` run in that many epochs,
    and each further step in one more, every epoch after the first on fresh instances (``restart()``, then the
    warm-up again, its requests neither metered nor timed): each side of the comparison is then the mean over
    several processes, not one process's few per cent of luck.

    ``seed``: every round (warm-up and measured) sends its requests in an order drawn afresh from a generator
    seeded with it (:func:`bench.load.generators.alternate`), so that no target always follows the same one;
    ``None``: the order rotates every round."""
    order = random.Random(seed) if seed is not None else None

    def warm() -> None:
        marks = {k: len(cast(Any, t).timings) for k, t in targets.items()
                 if isinstance(getattr(t, "timings", None), list)}
        if burst > 1:
            for target in targets.values():
                closed_loop(target, pool, clients=burst, requests=2)
        alternate(targets, pool, rounds=warmup, order=order)
        for k, n in marks.items():  # the timings kept are the measured requests', in order
            del cast(Any, targets[k]).timings[n:]

    def epoch(n: int, fresh: bool) -> dict[str, dict[str, dict[str, Any]]]:
        if fresh and restart is not None:
            restart()
            warm()
        before = {k: t.usage() for k, t in targets.items()}
        for k, v in alternate(targets, pool, rounds=n, order=order).items():
            samples.setdefault(k, []).extend(v)
        return {k: meter_delta(before[k], t.usage()) for k, t in targets.items()}

    samples: dict[str, list[Sample]] = {}
    parts = max(1, epochs if restart is not None else 1)
    warm()
    t0 = time.perf_counter()
    deltas = [epoch(n, i > 0) for i, n in enumerate(_split(rounds, parts)) if n > 0]
    done, cap = rounds, max(rounds, max_rounds or rounds)
    names = list(watched) if watched is not None else list(samples)
    while precision > 0 and done < cap and max(mean_uncertainty(samples[k]) for k in names) > precision:
        step = min(rounds, cap - done)
        deltas.append(epoch(step, parts > 1))
        done += step
    wall = time.perf_counter() - t0
    usage = {k: usage_summary(add_deltas([d[k] for d in deltas]), done) for k in targets}
    return samples, usage, wall


def _split(rounds: int, parts: int) -> list[int]:
    """``rounds`` in ``parts`` near-equal epochs (the first ones a round longer)."""
    q, r = divmod(rounds, parts)
    return [q + (i < r) for i in range(parts)]


def mean_uncertainty(samples: Sequence[Sample]) -> float:
    """The relative standard error of the mean latency of ``samples`` that answered (its standard deviation
    over the square root of their count, over their mean); infinite with fewer than two."""
    ok = [s.latency_ms for s in samples if s.ok]
    if len(ok) < 2 or statistics.fmean(ok) <= 0:
        return math.inf
    return statistics.stdev(ok) / math.sqrt(len(ok)) / statistics.fmean(ok)

"""The deployments one comparison makes on the platform process (removed at its end), and the interleaved
rounds of requests over them."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from bench.load.generators import alternate, closed_loop
from bench.load.inputs import InputPool
from bench.load.latency import Sample
from bench.load.targets import DeploymentTarget, Target
from bench.load.usage import UsageSummary, meter_delta, usage_summary

__all__ = ["Deployments", "deployments", "interleaved"]


class Deployments:
    """Deployments and targets made during one comparison, removed at its end (:func:`deployments`)."""

    def __init__(self, pp: Any) -> None:
        self.pp = pp
        self.deps: list[Any] = []
        self.targets: list[Any] = []

    def deploy(self, bundle: Path, name: str, *, keep_timings: bool = False, **kw: Any) -> DeploymentTarget:
        from serving.platform.deploy import deploy_bundle, new_deployment_id

        dep = deploy_bundle(self.pp.client, bundle, deployment=new_deployment_id(f"{name}-"), **kw)
        self.deps.append(dep)
        t = DeploymentTarget(dep, self.pp.url, name=name, keep_timings=keep_timings)
        self.targets.append(t)
        return t

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


def interleaved(targets: Mapping[str, Target], pool: InputPool, rounds: int, *, warmup: int = 3, burst: int = 1
                ) -> tuple[dict[str, list[Sample]], dict[str, UsageSummary], float]:
    """Warm every target up, then ``rounds`` interleaved rounds; samples, meter usage per target, wall s.

    ``burst`` > 1: the warm-up first sends each target that many requests at once (twice), so that every
    function holds that many warm instances, as a service that has seen that much concurrency does. A split
    plan hedges its stragglers (after 20 calls of a part, past their p95); with one instance per function
    each first hedge starts one, cold, inside the measured rounds, and on a small host every instance's
    cold start takes CPU from the request being timed."""
    if burst > 1:
        for target in targets.values():
            closed_loop(target, pool, clients=burst, requests=2)
    alternate(targets, pool, rounds=warmup)
    before = {k: t.usage() for k, t in targets.items()}
    t0 = time.perf_counter()
    samples = alternate(targets, pool, rounds=rounds)
    wall = time.perf_counter() - t0
    usage = {k: usage_summary(meter_delta(before[k], t.usage()), rounds) for k, t in targets.items()}
    return samples, usage, wall

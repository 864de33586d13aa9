"""One plan over each transport: shared memory against Redis and against inline (inside the invocation)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness.redis_server import available_redis
from bench.load.inputs import InputPool
from bench.suite.comparison import Comparison, latency_comparison
from bench.suite.config import MEMORY_MB, ModelSpec, SuiteConfig, label
from bench.suite.deployments import deployments, interleaved
from bench.suite.planning import load_model

__all__ = ["transports"]


def transports(pp: Any, spec: ModelSpec, cfg: SuiteConfig, work: Path, invoke: Any,
               say: Callable[[str], None]) -> list[Comparison]:
    from partitioner.planner import PlanRequest, export_solution, solve

    say(f"transports: {label(spec)}: planning")
    name, lg, pm, source = load_model(spec, invoke)
    req = PlanRequest(mode="lo", platform="local", memory=MEMORY_MB, transport="shm", max_group=cfg.max_group)
    result = solve(lg, req, pm=pm)
    bundle = export_solution(lg, result, req, work / f"transport-{name.replace('/', '_')}", source=source)
    pool = InputPool.from_bundle(bundle, 4)
    # a Redis: the tests' ($REDIS_URL), the default one, or one started for this comparison
    with available_redis(os.environ.get("REDIS_URL"), "redis://127.0.0.1:6379/0") as url, deployments(pp) as st:
        targets = {"shm": st.deploy(bundle, "tshm", transport="shm"),
                   "inline": st.deploy(bundle, "tinline", transport="inline")}
        if url:
            targets["redis"] = st.deploy(bundle, "tredis", transport="redis", redis_url=url)
        say(f"transports: {name}: {cfg.transport_rounds} interleaved rounds over {', '.join(targets)}")
        samples, _, _ = interleaved(targets, pool, cfg.transport_rounds)
    plan = [str(c) for c in result.choices]
    out = []
    for base in ("redis", "inline"):
        if base not in samples:
            out.append(Comparison(f"shm_vs_{base}", name, None, 0, "measured", base, "shm", "p50 latency ms",
                                  notes=("no Redis server: set REDIS_URL or install redis-server",)))
            continue
        out.append(latency_comparison(f"shm_vs_{base}", name, base, "shm", samples, plan=plan))
    return out

"""`flatpack bench chaos [DEPLOYMENT]`: faults injected while a closed-loop load runs; is anything lost?

Phases, each a closed loop of ``--clients`` clients over real HTTP to the OIP v2 endpoint:

1. warm-up (three times the clients, so every function has spare warm instances; not measured);
2. fault-free: the baseline p99;
3. faults: a :class:`FaultInjector` polls the platform's instances and SIGKILLs busy worker instances
   until ``kill_rate`` of all worker invocations so far were killed mid-request (10 % by default: the
   issue's "10 % worker failures"), and SIGSTOPs others for ``straggler_ms`` (stragglers, SIGCONT after).
   Phases 2 and 3 alternate ``--rounds`` times, so both see the same background load;
4. disruptions: while the load goes on, every idle instance is stopped at once (what an idle-timeout sweep
   of the whole platform does: the next requests are cold starts), and, when the benchmark started its
   own redis-server (``--transport redis`` without DEPLOYMENT), Redis is restarted. A Redis this
   benchmark did not start is never touched. Then one busy worker instance exceeds its memory (its limit
   lowered below what it holds; the platform's watchdog kills it as Lambda would, and its request ends with
   the platform's out-of-memory error: a clear error, not retried, since a deterministic OOM would fail
   again). Only for the deployment the benchmark made itself.

Each client pauses ``--think-ms`` (250 ms) after every response: an interactive closed loop that keeps
this 2-core machine below saturation. At saturation the figure would measure CPU contention, not
recovery: every killed instance is replaced by a new process (about 0.14 CPU-s to start, against about
12 ms of CPU per request), so 10 % kills at full load add several times the requests' own CPU.

Every response is checked against onnxruntime's output of the source model for the same input. A request
is *correct* (HTTP 200, every output within 1e-4), *wrong* (HTTP 200, wrong output: must never happen),
a *clear error* (an HTTP error status with a JSON ``{"error": ...}`` body naming the problem) or *lost*
(no answer: connection dropped, timeout, garbage). Top-level counts cover phases 3 and 4; ``p99_ms`` is
phase 3's, ``p99_ms_fault_free`` phase 2's. Without DEPLOYMENT the benchmark deploys
:class:`bench.local_deployment.SmallDeployment` itself and afterwards reports what was left behind
(instance processes, shared-memory files, Redis keys): all must be 0.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from bench.latency import Sample, percentile
from bench.local_deployment import InstanceSource, InstanceView

__all__ = ["ChaosSpec", "FaultInjector", "chaos_cmd", "classify", "run_chaos"]

log = logging.getLogger(__name__)

_CLEAR = re.compile(r'^InferError: HTTP [45]\d\d: \{"error":')


def classify(s: Sample) -> str:
    """correct | wrong | clear_error | lost."""
    if s.error is None:
        return "correct" if s.correct else "wrong"
    return "clear_error" if _CLEAR.match(s.error) else "lost"


# -- fault injection -----------------------------------------------------------------------------------


@dataclass
class FaultCounts:
    worker_invocations: int = 0
    kills: int = 0
    stragglers: int = 0
    kill_fraction: float = 0.0
    straggler_fraction: float = 0.0


class FaultInjector:
    """Kills and stalls busy worker instances (real processes, real signals) at a rate of their invocations.

    Every ``poll_s`` it reads the instances (``source``), counts the worker invocations started since it
    began, and while fewer than ``kill_rate`` x that many instances were killed, SIGKILLs a busy worker
    instance chosen at random (its request fails as the platform sees the process die; the master
    retries the part). Stragglers the same way at ``straggler_rate``: SIGSTOP, then SIGCONT after
    ``straggler_ms`` (the master may hedge). Only busy instances are hit, so every kill fails a request
    in flight; the achieved fractions are reported.
    """

    def __init__(self, source: InstanceSource, workers: Sequence[str], *, kill_rate: float = 0.10,
                 straggler_rate: float = 0.0, straggler_ms: float = 250.0, poll_s: float = 0.002,
                 seed: int = 0) -> None:
        if not 0 <= kill_rate < 1 or not 0 <= straggler_rate < 1:
            raise ValueError(f"kill and straggler rates must be in [0, 1), got {kill_rate}, {straggler_rate}")
        self._source = source
        self._workers = set(workers)
        self.kill_rate = kill_rate
        self.straggler_rate = straggler_rate
        self.straggler_ms = straggler_ms
        self.poll_s = poll_s
        self._rng = random.Random(seed)
        self._base: dict[tuple[str, int], int] = {}
        self._seen: dict[tuple[str, int], int] = {}
        self._stopped: dict[int, float] = {}  # pid -> when to SIGCONT
        self._hit: set[tuple[str, int]] = set()
        self.counts = FaultCounts()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _workers_now(self) -> list[InstanceView]:
        return [v for v in self._source() if v.function in self._workers]

    def start(self) -> FaultInjector:
        for v in self._workers_now():
            self._base[(v.function, v.instance)] = v.invocations
        self._thread = threading.Thread(target=self._run, name="flatpack-chaos", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> FaultCounts:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        for pid in list(self._stopped):
            self._signal(pid, signal.SIGCONT)
        self._stopped.clear()
        c = self.counts
        if c.worker_invocations:
            c.kill_fraction = c.kills / c.worker_invocations
            c.straggler_fraction = c.stragglers / c.worker_invocations
        return c

    @staticmethod
    def _signal(pid: int, sig: int) -> bool:
        try:
            os.kill(pid, sig)
            return True
        except ProcessLookupError:
            return False

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            now = time.monotonic()
            for pid, due in list(self._stopped.items()):
                if now >= due:
                    self._signal(pid, signal.SIGCONT)
                    del self._stopped[pid]
            try:
                views = self._workers_now()
            except Exception:  # noqa: BLE001 - a failed poll is retried on the next tick
                log.debug("reading instances failed", exc_info=True)
                continue
            for v in views:
                k = (v.function, v.instance)
                self._seen[k] = max(self._seen.get(k, 0), v.invocations)
            c = self.counts
            c.worker_invocations = sum(n - self._base.get(k, 0) for k, n in self._seen.items())
            busy = [v for v in views if v.busy and (v.function, v.instance) not in self._hit
                    and v.pid not in self._stopped]
            self._rng.shuffle(busy)
            while busy and c.kills < self.kill_rate * c.worker_invocations:
                v = busy.pop()
                if self._signal(v.pid, signal.SIGKILL):
                    self._hit.add((v.function, v.instance))
                    c.kills += 1
            while busy and c.stragglers < self.straggler_rate * c.worker_invocations:
                v = busy.pop()
                if self._signal(v.pid, signal.SIGSTOP):
                    self._stopped[v.pid] = now + self.straggler_ms / 1000
                    c.stragglers += 1


# -- a run ---------------------------------------------------------------------------------------------


@dataclass
class ChaosSpec:
    """What to run. ``requests``: per client in the fault phase; ``fault_free_requests``: per client in the
    baseline phase; ``disruption_requests``: per client in the disruption phase (0: skip it)."""

    clients: int = 4
    requests: int = 60
    fault_free_requests: int = 40
    disruption_requests: int = 25
    warmup: int = 5
    think_ms: float = 250.0
    rounds: int = 3
    kill_rate: float = 0.10
    straggler_rate: float = 0.01
    straggler_ms: float = 250.0
    pool: int = 8
    seed: int = 0


def _phase(samples: Sequence[Sample], wall_s: float, meter: dict[str, Any] | None = None) -> dict[str, Any]:
    kinds = Counter(classify(s) for s in samples)
    lat = [s.latency_ms for s in samples if s.error is None]
    errors = Counter((s.error or "")[:160] for s in samples if s.error is not None)
    return {
        "sent": len(samples),
        "answered": kinds["correct"] + kinds["wrong"],
        "correct": kinds["correct"],
        "wrong": kinds["wrong"],
        "clear_errors": kinds["clear_error"],
        "lost": kinds["lost"],
        "p50_ms": percentile(lat, 50),
        "p99_ms": percentile(lat, 99),
        "p95_ms": percentile(lat, 95),
        "slowest_ms": [round(x, 1) for x in sorted(lat)[-5:]],
        "wall_s": wall_s,
        "rps": len(samples) / wall_s if wall_s > 0 else float("nan"),
        "errors": dict(errors.most_common(5)),
        **({"platform": {k: meter[k] for k in ("invocations", "function_errors", "cold_starts")}} if meter else {}),
    }


def _settle(dep: Any, *, quiet_s: float = 0.5, limit_s: float = 10.0) -> None:
    """Wait until the deployment's instance set has not changed for ``quiet_s`` (at most ``limit_s``)."""
    t_end = time.monotonic() + limit_s
    last = None
    since = time.monotonic()
    while time.monotonic() < t_end:
        now = sorted((v.function, v.instance) for v in dep.instances())
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.05)


def _share(total: int, parts: int, i: int) -> int:
    """Block ``i``'s share of ``total`` requests split into ``parts`` blocks (the first ones get the rest)."""
    return total // parts + (1 if i < total % parts else 0)


def _add(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    keys = ("invocations", "function_errors", "cold_starts")
    return {k: a.get(k, 0) + b.get(k, 0) for k in keys}


def _meter(target: Any, before: dict[str, Any]) -> dict[str, Any]:
    from bench.usage import meter_delta, usage_summary

    return usage_summary(meter_delta(before, target.usage()), 1)


def run_chaos(dep: Any, spec: ChaosSpec, *, say: Any = None) -> dict[str, Any]:
    """Run the phases on ``dep`` (a SmallDeployment or ExistingDeployment); the result document."""
    from bench.load import InputPool, closed_loop
    from bench.provenance import machine

    say = say or (lambda _m: None)
    if not dep.workers:
        raise ValueError("the deployment has no worker functions: nothing to kill (deploy a split plan)")
    pool = InputPool.from_bundle(dep.bundle, spec.pool, seed=spec.seed)
    target = dep.target
    say(f"warm-up ({3 * spec.clients} clients)")
    closed_loop(target, pool, clients=3 * spec.clients, requests=spec.warmup, first_index=5_000_000)

    # Fault-free and fault blocks alternate, `rounds` of each, so that both see the same background load
    # (a shared machine drifts over a run); each phase's figures are over all of its blocks.
    think = spec.think_ms / 1000
    base: list[Sample] = []
    faulty: list[Sample] = []
    base_wall = wall = 0.0
    counts = FaultCounts()
    m_base: dict[str, Any] = {}
    m_faults: dict[str, Any] = {}
    for r in range(spec.rounds):
        say(f"round {r + 1}/{spec.rounds}: fault-free block")
        u = target.usage()
        n = _share(spec.fault_free_requests, spec.rounds, r)
        s, w = closed_loop(target, pool, clients=spec.clients, requests=n, think_s=think, first_index=100_000 * r)
        base += s
        base_wall += w
        m_base = _add(m_base, _meter(target, u))
        say(f"round {r + 1}/{spec.rounds}: {spec.kill_rate:.0%} of worker invocations killed, "
            f"{spec.straggler_rate:.0%} stalled")
        u = target.usage()
        inj = FaultInjector(dep.instances, dep.workers, kill_rate=spec.kill_rate,
                            straggler_rate=spec.straggler_rate, straggler_ms=spec.straggler_ms,
                            poll_s=dep.poll_s, seed=spec.seed + r).start()
        try:
            s, w = closed_loop(target, pool, clients=spec.clients, requests=_share(spec.requests, spec.rounds, r),
                               first_index=1_000_000 + 100_000 * r, think_s=think)
        finally:
            c = inj.stop()
        faulty += s
        wall += w
        m_faults = _add(m_faults, _meter(target, u))
        _settle(dep)  # replacements of the last killed instances finish starting before the next block
        counts.worker_invocations += c.worker_invocations
        counts.kills += c.kills
        counts.stragglers += c.stragglers
    if counts.worker_invocations:
        counts.kill_fraction = counts.kills / counts.worker_invocations
        counts.straggler_fraction = counts.stragglers / counts.worker_invocations
    phases = {"fault_free": _phase(base, base_wall, m_base), "faults": _phase(faulty, wall, m_faults)}
    faults: dict[str, Any] = {"worker_kills": asdict(counts) | {"rate": spec.kill_rate},
                              "stragglers": {"count": counts.stragglers, "rate": spec.straggler_rate,
                                             "delay_ms": spec.straggler_ms}}

    disrupted: list[Sample] = []
    if spec.disruption_requests:
        say("disruption phase: all idle instances reaped" + (", Redis restarted" if dep.redis else ""))
        events: dict[str, Any] = {"reap_all": {}, "redis_restart": None if dep.redis else
                                  "skipped: the benchmark did not start this deployment's Redis"}
        box: dict[str, Any] = {}

        def load() -> None:
            box["samples"], box["wall"] = closed_loop(target, pool, clients=spec.clients, think_s=think,
                                                      requests=spec.disruption_requests, first_index=2_000_000)

        u = target.usage()
        t = threading.Thread(target=load, name="flatpack-chaos-load", daemon=True)
        t.start()
        expected = max(1.0, spec.disruption_requests * base_wall / max(1, spec.fault_free_requests))
        time.sleep(expected / 3)
        events["reap_all"] = {"instances_stopped": dep.reap_all(), "at_s": round(expected / 3, 2)}
        time.sleep(expected / 6)
        events["memory"] = dep.squeeze_memory() or "skipped: no worker instance of this process's platform was busy"
        if dep.redis is not None:
            time.sleep(expected / 6)
            events["redis_restart"] = {"down_s": round(dep.redis.restart(), 3)}
        t.join()
        disrupted = box["samples"]
        phases["disruptions"] = _phase(disrupted, box["wall"], _meter(target, u))
        faults["disruptions"] = events

    total = _phase([*faulty, *disrupted], wall)
    doc: dict[str, Any] = {
        "benchmark": "chaos",
        "sent": total["sent"],
        "answered": total["answered"],
        "correct": total["correct"],
        "clear_errors": total["clear_errors"],
        "lost": total["lost"],
        "wrong": total["wrong"],
        "correct_fraction": total["correct"] / total["sent"] if total["sent"] else float("nan"),
        "p99_ms": phases["faults"]["p99_ms"],
        "p99_ms_fault_free": phases["fault_free"]["p99_ms"],
        "faults": faults,
    }
    doc["p99_ratio"] = doc["p99_ms"] / doc["p99_ms_fault_free"]
    doc["targets"] = {"lost_zero": doc["lost"] == 0 and doc["wrong"] == 0,
                      "correct_ge_99pct": doc["correct_fraction"] >= 0.99,
                      "p99_le_2x_fault_free": doc["p99_ratio"] <= 2.0}
    doc["phases"] = phases
    doc["config"] = asdict(spec) | {"deployment": dep.name, "transport": dep.transport,
                                    "workers": list(dep.workers)}
    doc["machine"] = machine()
    return doc


# -- the command ---------------------------------------------------------------------------------------


@click.command("chaos")
@click.argument("deployment", required=False)
@click.option("--clients", "-c", default=4, show_default=True, help="Concurrent closed-loop clients.")
@click.option("--requests", "-n", default=60, show_default=True, help="Requests per client under faults.")
@click.option("--fault-free-requests", default=40, show_default=True, help="Requests per client, baseline.")
@click.option("--disruption-requests", default=25, show_default=True,
              help="Requests per client while instances are reaped / Redis restarts (0: skip).")
@click.option("--rounds", default=3, show_default=True,
              help="Fault-free and fault blocks alternate this many times (same background load for both).")
@click.option("--think-ms", default=250.0, show_default=True,
              help="Each client's pause after a response (keeps the machine below saturation).")
@click.option("--kill-rate", default=0.10, show_default=True, help="Fraction of worker invocations killed.")
@click.option("--straggler-rate", default=0.01, show_default=True, help="Fraction of worker invocations stalled.")
@click.option("--straggler-ms", default=250.0, show_default=True, help="How long a straggler is stalled.")
@click.option("--transport", type=click.Choice(["shm", "redis", "inline"]), default="shm", show_default=True,
              help="Own deployment only: redis starts a redis-server of its own (and restarts it).")
@click.option("--hedge-percentile", type=float, default=95.0, show_default=True,
              help="Own deployment only: hedge parts running past this percentile (0: no hedging).")
@click.option("--seed", default=0, show_default=True)
@click.option("--out", type=click.Path(file_okay=False), default="bench/results", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def chaos_cmd(deployment: str | None, clients: int, requests: int, fault_free_requests: int,
              disruption_requests: int, rounds: int, think_ms: float, kill_rate: float, straggler_rate: float,
              straggler_ms: float, transport: str, hedge_percentile: float, seed: int, out: str, as_json: bool) -> None:
    """Faults under load: kill and stall worker instances, reap all instances, restart Redis (its own only);
    count requests sent / answered / correct / failed with a clear error / lost, p99 vs fault-free.

    DEPLOYMENT: a running `flatpack deploy` deployment; without it a small vgg11 is deployed and removed."""
    from bench.local_deployment import ExistingDeployment, SmallDeployment
    from serving.cli.console import console, err_console

    if clients < 1 or rounds < 1 or requests < rounds or fault_free_requests < rounds or disruption_requests < 0:
        raise click.BadParameter("clients and rounds must be >= 1, request counts >= rounds (disruption requests "
                                 ">= 0)")
    spec = ChaosSpec(clients=clients, requests=requests, fault_free_requests=fault_free_requests,
                     disruption_requests=disruption_requests, rounds=rounds, think_ms=think_ms, kill_rate=kill_rate,
                     straggler_rate=straggler_rate, straggler_ms=straggler_ms, seed=seed)

    def say(msg: str) -> None:
        err_console.print(f"[dim]{msg}[/]")

    try:
        if deployment:
            dep: Any = ExistingDeployment(deployment)
        else:
            dep = SmallDeployment(transport=transport, hedge_percentile=hedge_percentile or None, progress=say)
    except (LookupError, ValueError, FileNotFoundError) as e:
        raise click.ClickException(str(e)) from e
    except ImportError as e:  # the small model is built with torch (the zoo extra)
        raise click.ClickException(f"deploying the small model needs {e.name or e}: pip install -e '.[zoo]', "
                                   "or name a running deployment") from e
    try:
        doc = run_chaos(dep, spec, say=say)
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    finally:
        if not deployment:
            say("tearing down")
        left = dep.close()
    if not deployment:
        doc["leftovers_after_teardown"] = left
    path = Path(out) / f"chaos-{deployment or 'own'}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str))
    if as_json:
        click.echo(json.dumps(doc, indent=1, default=str))
    else:
        ph = doc["phases"]
        console.print(f"sent {doc['sent']}, answered {doc['answered']}, correct {doc['correct']} "
                      f"({doc['correct_fraction']:.2%}), clear errors {doc['clear_errors']}, lost {doc['lost']}, "
                      f"wrong {doc['wrong']}")
        console.print(f"p99 {doc['p99_ms']:.1f} ms under faults vs {doc['p99_ms_fault_free']:.1f} ms fault-free "
                      f"({doc['p99_ratio']:.2f}x); kills {doc['faults']['worker_kills']['kills']} of "
                      f"{doc['faults']['worker_kills']['worker_invocations']} worker invocations")
        for k, v in ph.items():
            console.print(f"  {k}: {json.dumps({x: v[x] for x in ('sent', 'correct', 'clear_errors', 'lost')})} "
                          f"p50 {v['p50_ms']:.1f} p99 {v['p99_ms']:.1f} ms")
        err_console.print(f"wrote {path}")
    t = doc["targets"]
    if not (t["lost_zero"] and t["correct_ge_99pct"]):
        raise SystemExit(1)




"""``flatpack deploy --watch``: re-plan a deployment whose live latency stops keeping its SLO.

The endpoint keeps a window of its recent requests' latencies per model (:mod:`serving.api.slo`). A
:class:`Watcher` (a thread of the serving process) looks at it every ``every_s`` seconds. When the window
misses the SLO by more than its sampling error (a percentile SLO P: fewer than P of its requests within it;
a mean SLO: its mean above it; :meth:`serving.api.slo.SloSnapshot.missed_surely`) at ``checks`` checks in a
row, over at least ``min_requests`` requests, it re-plans the way the promise loop
does (:func:`serving.deploy.promise.replan_with_live`): the live statistic corrects the performance model at
the serving plan's master memory, the solver plans again against the SLO, and a different plan is exported
and swapped in blue/green (:class:`serving.deploy.promise.LocalSwap`). The decision logic is
:class:`Hysteresis`, pure and tested on synthetic streams.

No flapping: a miss must last ``checks`` checks (a burst shorter than that re-plans nothing); after a
re-plan the window starts again (the new plan's requests only) and nothing is decided for ``cooldown_s``
and until the window holds ``min_requests`` again. Each decision is logged as one line and recorded in the
deployment's ``options["watch"]`` (``replans``, ``last``, ``history``).

A cloud deployment has no such process: ``flatpack watch`` probes it from where the user runs it, with the
same :class:`Hysteresis` (:mod:`serving.deploy.cloud_watch`).

Settings (environment, for tests and tuning; each reader raises ``ValueError`` naming the variable):
``FLATPACK_WATCH_EVERY_S`` (5), ``FLATPACK_WATCH_CHECKS`` (3), ``FLATPACK_WATCH_MIN_REQUESTS`` (100),
``FLATPACK_WATCH_WINDOW_REQUESTS`` (1000), ``FLATPACK_WATCH_WINDOW_S`` (300), ``FLATPACK_WATCH_COOLDOWN_S``
(60).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from serving.api.slo import SloSnapshot

if TYPE_CHECKING:
    from serving.api.dataplane import DataPlane
    from serving.deploy.promise import Swap
    from serving.deploy.state import DeploymentRecord

__all__ = ["COOLDOWN_S", "EVERY_S", "MIN_REQUESTS", "Hysteresis", "LocalReplanner", "WINDOW_REQUESTS", "WINDOW_S",
           "WatchSettings", "Watcher", "plan_request_options", "replan_decision", "request_from_options"]

log = logging.getLogger(__name__)

EVERY_S = "FLATPACK_WATCH_EVERY_S"
CHECKS = "FLATPACK_WATCH_CHECKS"
MIN_REQUESTS = "FLATPACK_WATCH_MIN_REQUESTS"
WINDOW_REQUESTS = "FLATPACK_WATCH_WINDOW_REQUESTS"
WINDOW_S = "FLATPACK_WATCH_WINDOW_S"
COOLDOWN_S = "FLATPACK_WATCH_COOLDOWN_S"


def _number(name: str, default: float, env: Mapping[str, str], *, whole: bool = False,
            least: float = 0.0) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > least) or (whole and value != int(value)):
        kind = "a whole number" if whole else "a number"
        raise ValueError(f"{name}={raw!r}: give {kind} above {least:g}")
    return value


@dataclass(frozen=True)
class WatchSettings:
    """How the watcher looks: every ``every_s`` seconds; a re-plan after ``checks`` missed checks in a row,
    each over at least ``min_requests`` requests of the window (the last ``window_requests`` requests, none
    older than ``window_s``); none within ``cooldown_s`` of the last."""

    every_s: float = 5.0
    checks: int = 3
    min_requests: int = 100
    window_requests: int = 1000
    window_s: float = 300.0
    cooldown_s: float = 60.0

    def __post_init__(self) -> None:
        if self.checks < 1 or self.min_requests < 1 or self.window_requests < self.min_requests:
            raise ValueError(f"watch settings: checks and min_requests must be at least 1 and the window hold "
                             f"min_requests; got {self}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, defaults: WatchSettings | None = None
                 ) -> WatchSettings:
        """The settings the ``FLATPACK_WATCH_*`` variables of ``env`` (default: the process's) give, each unset
        one from ``defaults`` (default: this class's: the endpoint's own window; the probing watch of
        :mod:`serving.deploy.cloud_watch` has its own)."""
        e = os.environ if env is None else env
        d = cls() if defaults is None else defaults
        return cls(every_s=_number(EVERY_S, d.every_s, e),
                   checks=int(_number(CHECKS, d.checks, e, whole=True)),
                   min_requests=int(_number(MIN_REQUESTS, d.min_requests, e, whole=True)),
                   window_requests=int(_number(WINDOW_REQUESTS, d.window_requests, e, whole=True)),
                   window_s=_number(WINDOW_S, d.window_s, e),
                   cooldown_s=_number(COOLDOWN_S, d.cooldown_s, e, least=-1e-9))

    def to_json(self) -> dict[str, float]:
        return dataclasses.asdict(self)


class Hysteresis:
    """When to re-plan, from the window's figures at each check (see the module docstring). Pure: the
    caller passes the figures and the time."""

    def __init__(self, settings: WatchSettings) -> None:
        self.settings = settings
        self.checks = 0
        self.missed_in_row = 0
        self.replans = 0
        self.quiet_until = -math.inf

    def check(self, snap: SloSnapshot | None, now: float) -> str | None:
        """The reason to re-plan now, or None. A check that says re-plan starts the cool-down; the caller
        starts the window again."""
        self.checks += 1
        s = self.settings
        if now < self.quiet_until or snap is None or snap.requests < s.min_requests:
            self.missed_in_row = 0
            return None
        if not snap.missed_surely():
            self.missed_in_row = 0
            return None
        self.missed_in_row += 1
        if self.missed_in_row < s.checks:
            return None
        self.missed_in_row = 0
        self.replans += 1
        self.quiet_until = now + s.cooldown_s
        stat = "mean" if snap.percentile is None else f"p{snap.percentile * 100:g}"
        return (f"live {stat} {snap.statistic_ms:.1f} ms against the {snap.slo_ms:g} ms SLO "
                f"({snap.attainment:.1%} of {snap.requests} requests within it) at {s.checks} checks in a row")

    def to_json(self) -> dict[str, Any]:
        return {"checks": self.checks, "missed_in_row": self.missed_in_row, "replans": self.replans}


class Watcher:
    """The serving process's watch of model ``name`` on ``plane``: :class:`Hysteresis` every ``every_s``,
    ``replan(snapshot)`` (returning one line: what it did) when it says so. ``armed()``: whether to look
    yet (deploy's own live check runs first); ``on_decision(entry)``: where each decision is recorded."""

    def __init__(self, plane: DataPlane, name: str, replan: Callable[[SloSnapshot], str], settings: WatchSettings,
                 *, armed: Callable[[], bool] = lambda: True,
                 on_decision: Callable[[dict[str, Any]], None] = lambda _e: None) -> None:
        self.plane = plane
        self.name = name
        self.replan = replan
        self.settings = settings
        self.hysteresis = Hysteresis(settings)
        self._armed = armed
        self._is_armed = False
        self._on_decision = on_decision
        self.last: dict[str, Any] | None = None

    def status(self) -> dict[str, Any]:
        return {"armed": self._is_armed, **self.hysteresis.to_json(), "settings": self.settings.to_json(),
                "last": self.last}

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.settings.every_s):
            try:
                self.step()
            except Exception:  # noqa: BLE001 - the watch must outlive one bad check; the endpoint keeps serving
                log.exception("the SLO watch of %s failed a check", self.name)

    def step(self, now: float | None = None) -> dict[str, Any] | None:
        """One check; the decision's record where it re-planned."""
        if not self._is_armed:
            self._is_armed = bool(self._armed())
            if not self._is_armed:
                return None
            self.plane.window(self.name).clear()  # the live check's probes are not the users' traffic
        _, snap = self.plane.slo(self.name)
        reason = self.hysteresis.check(snap, time.monotonic() if now is None else now)
        if reason is None or snap is None:  # check() re-plans only on figures
            return None
        self.last = replan_decision(self.name, reason, snap, self.replan)
        self.plane.window(self.name).clear()  # the cool-down: the window fills again before the next decision
        self._on_decision(self.last)
        return self.last


def replan_decision(name: str, reason: str, snap: SloSnapshot, replan: Callable[[SloSnapshot], str]
                    ) -> dict[str, Any]:
    """Re-plan deployment ``name`` for ``reason`` (what :meth:`Hysteresis.check` said), logged; the decision's
    record. A re-plan that fails is recorded as such: the plan serving now goes on serving."""
    log.warning("%s: re-planning: %s", name, reason)
    try:
        outcome = replan(snap)
    except Exception as e:  # noqa: BLE001 - the plan serving now goes on serving; the record says why
        log.exception("%s: re-planning failed", name)
        outcome = f"failed: {type(e).__name__}: {e}"
    log.warning("%s: %s", name, outcome)
    return {"at_unix": round(time.time(), 3), "reason": reason, "outcome": outcome, "live": snap.to_json()}


def plan_request_options(request: Any, model: str, shapes: Any) -> dict[str, Any]:
    """What the serving process needs to plan ``request`` again for ``model`` (a deployment record's
    ``options["plan"]``, recorded by a deploy with an SLO). Autoencoders are not kept: ``--watch`` refuses
    them."""
    fields = ("mode", "slo_ms", "solver", "platform", "memory", "percentile", "max_group", "transport", "profile",
              "profile_budget_s", "hedge", "seed", "extra")
    return {"request": {f: getattr(request, f) for f in fields}, "model": model,
            "inputs": {k: list(v) for k, v in dict(shapes.inputs).items()}, "dims": dict(shapes.dims)}


def request_from_options(doc: Mapping[str, Any]) -> Any:
    from partitioner.planner import PlanRequest

    return PlanRequest(**dict(doc["request"]))


class LocalReplanner:
    """Re-plans a local deployment in its serving process: the layer graph and performance model are built
    on first use (profiles are cached, so it takes seconds), corrected by the live figures deploy's check
    recorded (``options["promise"]["correction"]``); each call corrects them by the window's statistic,
    solves again and swaps a different plan in (:class:`serving.deploy.promise.LocalSwap`)."""

    def __init__(self, record: DeploymentRecord) -> None:
        self.record = record
        self._pm: Any = None
        self._lg: Any = None
        self._request: Any = None
        self._current: Any = None
        self._round = 0

    def _load(self) -> None:
        from partitioner.graph import LayerGraph
        from partitioner.live import LiveCorrection
        from partitioner.planner import make_perfmodel, solve, with_sampled_tail
        from serving.deploy.state import DeploymentRecord

        options = DeploymentRecord.load(self.record.name).options
        doc = options["plan"]
        self._request = request_from_options(doc)
        self._lg = LayerGraph.load(doc["model"], {k: tuple(v) for k, v in doc.get("inputs", {}).items()},
                                   dict(doc.get("dims", {})))
        self._pm, _, _ = make_perfmodel(self._lg, self._request)
        correction = (options.get("promise") or {}).get("correction")
        if correction:
            self._pm.use_live(LiveCorrection.from_json(correction))
        # the plan serving now: the one the planner makes with what the live check taught it
        self._current = with_sampled_tail(self._pm, solve(self._lg, self._request, pm=self._pm))

    def __call__(self, snap: SloSnapshot) -> str:
        from partitioner.planner import solve, with_sampled_tail
        from serving.deploy.promise import function_count, replan_with_live

        if self._pm is None:
            self._load()
        pm, lg, request = self._pm, self._lg, self._request
        candidate, factor, feasible = replan_with_live(
            pm, request, self._current, snap.statistic_ms,
            replan=lambda req: with_sampled_tail(pm, solve(lg, req, pm=pm)))
        if candidate is None:
            return f"kept the plan: no plan is predicted to meet the SLO (live correction x{factor:.2f})"
        old = self._current
        if (tuple(candidate.choices), candidate.master_mb) == (tuple(old.choices), old.master_mb):
            return (f"kept the plan: corrected by the live figure (x{factor:.2f} at {old.master_mb} MB), it is "
                    f"still the {'cheapest meeting the SLO' if feasible else 'fastest there is'}")
        self._round += 1
        self._swap(lg, request, f"re-planned by the SLO watch ({snap.statistic_ms:.1f} ms live)")(
            candidate, self._round_no())
        self._current = candidate
        return (f"swapped in {'a' if feasible else 'the fastest'} plan: {function_count(candidate)} function(s), "
                f"master {candidate.master_mb} MB (was {function_count(old)}, {old.master_mb} MB), live correction "
                f"x{factor:.2f}")

    def _swap(self, lg: Any, request: Any, source: str) -> Swap:
        """What swaps a plan in: the serving process's blue/green switch."""
        from serving.deploy.promise import LocalSwap

        return LocalSwap(self.record.name, lg, request, source=source)

    def _round_no(self) -> int:
        """The swap's round: past the promise loop's (at most 10), so its bundle names never clash."""
        return 100 + self._round

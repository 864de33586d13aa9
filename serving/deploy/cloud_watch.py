"""``flatpack watch NAME``: the SLO watch of a deployment, run by probing it from where the user runs it.

A cloud deployment has no flatpack process beside it to keep a window of its users' requests (the local
endpoint's :mod:`serving.deploy.watch` does), so this watch makes its own traffic: every ``every_s``
seconds a :class:`CloudWatcher` sends ``requests`` probe requests through the deployment's probe (the path
deploy's live check takes: :class:`serving.deploy.cloud_promise.LambdaProbe` on AWS Lambda, the endpoint's
HTTP route (:class:`serving.deploy.promise.EndpointProbe`) on OpenFaaS and locally), adds their latencies to
a :class:`serving.api.slo.LatencyWindow`, and asks the same :class:`serving.deploy.watch.Hysteresis` as the
endpoint's watch whether the window keeps missing the SLO (by more than its sampling error, ``checks``
checks in a row, over at least ``min_requests`` probes; then a cool-down and a fresh window).

What a re-plan does depends on where the deployment runs:

* AWS Lambda: :class:`LambdaReplanner`: the window's statistic corrects the performance model at the
  serving plan's master memory (:func:`serving.deploy.promise.replan_with_live`), the solver plans again,
  and a different plan is swapped in blue/green behind the master's ``live`` alias
  (:class:`serving.deploy.cloud_promise.LambdaSwap`), which updates the deployment's record so that
  ``undeploy`` removes what is live.
* local: the same with the serving process's swap (:class:`serving.deploy.watch.LocalReplanner`).
* OpenFaaS: a plan there is an image to build, which the gateway's API does not do: the watch reports the
  miss and swaps nothing (deploy again to re-plan). So does any deployment whose record lacks what planning
  again needs (one deployed without ``--slo``, or with ``--compress ae``).

Each decision is one line (through ``say``) and an entry in the record's ``options["watch"]`` (``replans``:
the decisions so far, ``last``, ``history``: the last ten), as the endpoint's watch records its own.

Probes are invocations: on a cloud each one is billed. The defaults (:data:`CLOUD_DEFAULTS`) send 20
probes every 30 s (2,400 an hour), judge a window of the last 200 probes (at most 15 minutes old) once it
holds 40, re-plan after 3 missed checks in a row, and then wait 5 minutes. The ``FLATPACK_WATCH_*``
variables of :mod:`serving.deploy.watch` override them, and ``FLATPACK_WATCH_PROBES`` the probes per check.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serving.api.slo import LatencyWindow, SloSnapshot, SloTarget
from serving.deploy.watch import Hysteresis, LocalReplanner, WatchSettings, replan_decision

if TYPE_CHECKING:
    from serving.deploy.promise import Probe, Swap
    from serving.deploy.state import DeploymentRecord

__all__ = ["CLOUD_DEFAULTS", "Check", "CloudWatcher", "DEFAULT_PROBES", "LambdaReplanner", "PROBES", "cloud_settings",
           "cloud_watcher", "probes_per_check", "record_check", "set_watch_state"]

log = logging.getLogger(__name__)

PROBES = "FLATPACK_WATCH_PROBES"
#: probe requests per check
DEFAULT_PROBES = 20
#: a probing watch's settings: 20 probes every 30 s reach ``min_requests`` in two checks, the window holds the
#: last ten checks' probes
CLOUD_DEFAULTS = WatchSettings(every_s=30.0, checks=3, min_requests=40, window_requests=200, window_s=900.0,
                               cooldown_s=300.0)
_HISTORY = 10


def cloud_settings(env: Mapping[str, str] | None = None) -> WatchSettings:
    """:data:`CLOUD_DEFAULTS`, with the ``FLATPACK_WATCH_*`` variables of ``env`` (default: the process's)."""
    return WatchSettings.from_env(env, defaults=CLOUD_DEFAULTS)


def probes_per_check(env: Mapping[str, str] | None = None) -> int:
    """``FLATPACK_WATCH_PROBES`` (default :data:`DEFAULT_PROBES`); ``ValueError`` naming it when it is not a
    whole number of at least 1."""
    raw = (os.environ if env is None else env).get(PROBES, "").strip()
    if not raw:
        return DEFAULT_PROBES
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 1 and value == int(value)):
        raise ValueError(f"{PROBES}={raw!r}: give a whole number of probe requests, at least 1")
    return int(value)


@dataclass(frozen=True)
class Check:
    """One check: the window's figures after its probes (None: the window is empty), how many probes it
    sent, and the decision's record where it re-planned (or reported a miss it cannot re-plan)."""

    snapshot: SloSnapshot | None
    probes: int
    decision: dict[str, Any] | None = None

    @property
    def missed(self) -> bool:
        """Whether the window misses the SLO by more than its sampling error (``SloSnapshot.missed_surely``)."""
        return self.snapshot is not None and self.snapshot.missed_surely()

    def line(self, min_requests: int = 1) -> str:
        """The check as one line for a person (a window of fewer than ``min_requests`` probes is not judged)."""
        s = self.snapshot
        if s is None:
            return f"{self.probes} probe(s), no latencies yet"
        stat = "mean" if s.percentile is None else f"p{s.percentile * 100:g}"
        verdict = ("misses it" if self.missed else "holds") if s.requests >= min_requests else \
            f"too few to judge (needs {min_requests})"
        return (f"{stat} {s.statistic_ms:.1f} ms against the {s.slo_ms:g} ms SLO over the last {s.requests} probes "
                f"({s.attainment:.1%} within it): {verdict}")


class CloudWatcher:
    """The probing SLO watch of one deployment (see the module docstring).

    ``probe(n)`` sends ``n`` requests and returns their latencies (a :class:`serving.deploy.promise.Probe`);
    ``replan(snapshot)`` re-plans (or reports) and returns one line saying what it did; ``on_decision(entry)``
    records each decision; ``warmup`` probes are sent before the first check and not counted (a first
    request may start an instance). Not thread-safe: one caller checks at a time."""

    def __init__(self, name: str, target: SloTarget, probe: Probe, replan: Callable[[SloSnapshot], str],
                 settings: WatchSettings, *, requests: int = DEFAULT_PROBES, warmup: int = 0,
                 on_decision: Callable[[dict[str, Any]], None] = lambda _e: None,
                 close: Callable[[], None] = lambda: None) -> None:
        if requests < 1:
            raise ValueError(f"a check sends at least one probe request; got {requests!r}")
        self.name = name
        self.target = target
        self.probe = probe
        self.replan = replan
        self.settings = settings
        self.requests = requests
        self.window = LatencyWindow(settings.window_requests, settings.window_s)
        self.hysteresis = Hysteresis(settings)
        self._warmup = warmup
        self._on_decision = on_decision
        self._close = close
        self.last: dict[str, Any] | None = None

    def check(self, now: float | None = None, *, requests: int | None = None) -> Check:
        """Probe, add the latencies to the window, and decide (``now``: the monotonic clock's time, for the
        window's ages and the cool-down). A probe that fails raises: the window keeps what it had."""
        if self._warmup:
            self.probe(self._warmup)
            self._warmup = 0
        latencies = self.probe(requests or self.requests).latencies_ms
        t = time.monotonic() if now is None else now
        for ms in latencies:
            self.window.add(ms, now=t)
        snap = self.window.snapshot(self.target, now=t)
        reason = self.hysteresis.check(snap, t)
        if reason is None or snap is None:  # check() decides only on figures
            return Check(snap, len(latencies))
        self.last = replan_decision(self.name, reason, snap, self.replan)
        self.window.clear()  # the cool-down: the window fills again (the new plan's probes) before the next decision
        self._on_decision(self.last)
        return Check(snap, len(latencies), self.last)

    def status(self) -> dict[str, Any]:
        return {**self.hysteresis.to_json(), "settings": self.settings.to_json(), "requests": self.requests,
                "last": self.last}

    def close(self) -> None:
        self._close()


class LambdaReplanner(LocalReplanner):
    """Re-plans a Lambda deployment as :class:`serving.deploy.watch.LocalReplanner` does a local one, and swaps
    the plan in with :class:`serving.deploy.cloud_promise.LambdaSwap` (blue/green behind the ``live`` alias;
    the record then names what is live). ``drain_s``: how long the old workers keep answering after the
    switch; ``token``: the endpoint's bearer token, for the new master's warm-up requests."""

    def __init__(self, record: DeploymentRecord, *, token: str | None = None, drain_s: float = 10.0,
                 progress: Callable[[str], None] | None = None) -> None:
        super().__init__(record)
        self.token = token
        self.drain_s = drain_s
        self.progress = progress

    def _swap(self, lg: Any, request: Any, source: str) -> Swap:
        from serving.deploy.cloud_promise import LambdaSwap

        return LambdaSwap(self.record.name, lg, request, source=source, token=self.token, drain_s=self.drain_s,
                          progress=self.progress)

    def _round_no(self) -> int:
        """Past every round the record has seen: the new functions' names (``NAME-rN``) are new."""
        from serving.deploy.state import DeploymentRecord

        return 100 + int(DeploymentRecord.load(self.record.name).options.get("generation", 0)) + 1


def _report_only(why: str) -> Callable[[SloSnapshot], str]:
    def report(snap: SloSnapshot) -> str:
        return f"not re-planned: {why}"

    return report


def record_check(name: str, key: str, entry: dict[str, Any]) -> None:
    """Record ``entry`` in deployment ``name``'s ``options["watch"]``: ``key`` ``last`` (a decision: counted in
    ``replans`` and kept in ``history``), or ``last_check`` (a one-off check's verdict)."""
    from serving.deploy.state import DeploymentRecord

    r = DeploymentRecord.load(name)
    doc = dict(r.options.get("watch") or {})
    doc.setdefault("replans", 0)
    doc[key] = entry
    if key == "last":
        doc["replans"] = int(doc["replans"]) + 1
        doc["history"] = [*doc.get("history", [])[-(_HISTORY - 1):], entry]
    r.options["watch"] = doc
    r.save()


def set_watch_state(name: str, state: str) -> None:
    """Record what watches deployment ``name`` now (``status`` shows it); a record gone meanwhile is left gone."""
    from serving.deploy.state import DeploymentRecord

    try:
        r = DeploymentRecord.load(name)
    except LookupError:
        return
    r.options["watch"] = {"replans": 0, **dict(r.options.get("watch") or {}), "state": state}
    r.save()


def cloud_watcher(name: str, *, settings: WatchSettings | None = None, requests: int | None = None,
                  token: str | None = None, warmup: int = 3, drain_s: float = 10.0,
                  progress: Callable[[str], None] | None = None) -> CloudWatcher:
    """The probing watch of deployment ``name`` as its record describes it (see the module docstring).

    Raises ``LookupError`` for an unknown deployment, and ``ValueError`` for one with no SLO to keep or that
    does not run. ``settings`` and ``requests`` default to :func:`cloud_settings` and
    :func:`probes_per_check`."""
    from serving.deploy.state import DeploymentRecord

    record = DeploymentRecord.load(name)
    target = SloTarget.from_options(record.options.get("slo"))
    if target is None:
        raise ValueError(f"deployment {name!r} has no SLO to watch; deploy it with --slo (e.g. --slo 200ms)")
    if not record.running() or not record.endpoint:
        raise ValueError(f"deployment {name!r} is not running; deploy it again")
    settings = settings or cloud_settings()
    requests = requests or probes_per_check()
    model = _model_file(record)
    probe: Any
    if record.target == "lambda":
        from serving.deploy.cloud_promise import LambdaProbe

        probe = LambdaProbe(name, model, token=token, warmup=0)
    elif record.target in ("openfaas", "local"):
        from serving.deploy.promise import EndpointProbe

        probe = EndpointProbe(record.endpoint, name, model, token=token, warmup=0)
    else:
        raise ValueError(f"deployment {name!r} is on {record.target!r}; the watch probes local, lambda and openfaas")
    replan: Callable[[SloSnapshot], str]
    if record.target == "openfaas":
        replan = _report_only("on OpenFaaS a plan is an image to build, which the gateway's API does not do; "
                              f"`flatpack deploy --target openfaas` again re-plans (`flatpack undeploy {name}` first)")
    elif not record.options.get("plan"):
        replan = _report_only("the deployment's record does not say how it was planned (deployed without --slo, "
                              "with --compress ae, or by an older flatpack); deploy it again to re-plan")
    elif record.target == "lambda":
        replan = LambdaReplanner(record, token=token, drain_s=drain_s, progress=progress)
    else:
        replan = LocalReplanner(record)
    return CloudWatcher(name, target, probe, replan, settings, requests=requests, warmup=warmup,
                        on_decision=lambda entry: record_check(name, "last", entry), close=probe.close)


def _model_file(record: DeploymentRecord) -> Path:
    """The model the probes' random inputs are made for: the bundle's copy of it, else the deployed file."""
    bundled = Path(record.bundle) / "source.onnx"
    return bundled if bundled.is_file() else Path(record.model)

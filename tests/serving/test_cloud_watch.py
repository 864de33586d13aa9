"""The probing watch (`flatpack watch`): its decisions on a fake probe's synthetic latencies (no clock, no
sleeps), its settings, its record, and the command against a real HTTP endpoint served in this process."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from serving.api.slo import SloSnapshot, SloTarget
from serving.cli import main
from serving.deploy.cloud_watch import (
    CLOUD_DEFAULTS,
    CloudWatcher,
    cloud_settings,
    cloud_watcher,
    probes_per_check,
    record_check,
)
from serving.deploy.promise import Probed
from serving.deploy.watch import WatchSettings
from tests.onnx_builders import conv_stack

SETTINGS = WatchSettings(every_s=1.0, checks=2, min_requests=20, window_requests=40, window_s=1e9, cooldown_s=30.0)


class FakeProbe:
    """Latencies from ``draw(rng, n)``, which the test swaps to inject a slowdown; counts what it sent."""

    def __init__(self, draw: Callable[[np.random.Generator, int], np.ndarray], seed: int = 0) -> None:
        self.draw = draw
        self.rng = np.random.default_rng(seed)
        self.sent = 0

    def __call__(self, requests: int) -> Probed:
        self.sent += requests
        return Probed([float(x) for x in self.draw(self.rng, requests)])


def _watcher(probe: FakeProbe, target: SloTarget, decisions: list[dict], replans: list[SloSnapshot]
             ) -> CloudWatcher:
    def replan(snap: SloSnapshot) -> str:
        replans.append(snap)
        return "swapped in a plan"

    return CloudWatcher("m", target, probe, replan, SETTINGS, requests=10, on_decision=decisions.append)


def _tail_noise(rng: np.random.Generator, n: int) -> np.ndarray:
    # 97 % of requests around 80 ms, the rest far over a 100 ms SLO: single probes miss it, a window of
    # 40 sometimes holds fewer than 95 % within it
    return np.where(rng.random(n) < 0.97, rng.normal(80, 8, n), 130.0)


def _mean_noise(rng: np.random.Generator, n: int) -> np.ndarray:
    # a mean of about 80 ms against a 100 ms SLO, one request in ten at 250 ms: a window's mean now and then
    # above the SLO
    return np.where(rng.random(n) < 0.9, 60.0, 250.0)


@pytest.mark.parametrize("target", [SloTarget(100.0, 0.95), SloTarget(100.0)], ids=["p95", "mean"])
def test_an_injected_slowdown_re_plans_once_and_noise_never(target: SloTarget) -> None:
    noise = _mean_noise if target.percentile is None else _tail_noise
    probe = FakeProbe(noise)
    decisions: list[dict] = []
    replans: list[SloSnapshot] = []
    w = _watcher(probe, target, decisions, replans)
    checks = [w.check(now=float(t)) for t in range(200)]  # noise only: 2,000 probes
    assert replans == [] and decisions == [] and w.hysteresis.replans == 0
    assert any(c.snapshot is not None and not c.snapshot.met for c in checks)  # the noise does dip below
    assert checks[0].line(SETTINGS.min_requests).endswith("too few to judge (needs 20)")

    probe.draw = lambda rng, n: rng.normal(150, 10, n)  # the slowdown, for 25 checks; the cool-down is 30
    slow = [w.check(now=200.0 + t) for t in range(25)]
    assert len(replans) == 1 and w.hysteresis.replans == 1
    at = next(i for i, c in enumerate(slow) if c.decision is not None)
    assert 1 <= at <= 4  # the window misses once half of it is slow, then two checks in a row
    (entry,) = decisions
    assert entry is slow[at].decision and entry["outcome"] == "swapped in a plan"
    assert target.statistic in entry["reason"] and "100 ms SLO" in entry["reason"]
    assert entry["live"]["met"] is False and replans[0].statistic_ms > 100
    assert slow[at].missed and "misses it" in slow[at].line(SETTINGS.min_requests)
    # the slowdown over: the window refills with fast probes and nothing else is decided
    probe.draw = noise
    assert all(w.check(now=225.0 + t).decision is None for t in range(100))
    assert probe.sent == 10 * 325


def test_a_burst_shorter_than_the_checks_does_not_re_plan() -> None:
    probe = FakeProbe(lambda rng, n: rng.normal(50, 5, n))
    replans: list[SloSnapshot] = []
    w = _watcher(probe, SloTarget(100.0), [], replans)
    w.requests = 40
    for t in range(5):
        w.check(now=float(t))
    probe.draw = lambda rng, n: rng.normal(300, 10, n)  # one check's window, all slow
    assert w.check(now=5.0).missed
    probe.draw = lambda rng, n: rng.normal(50, 5, n)
    assert all(w.check(now=6.0 + t).decision is None for t in range(10)) and replans == []


def test_warm_up_probes_are_not_counted_and_a_failed_re_plan_is_recorded() -> None:
    probe = FakeProbe(lambda rng, n: np.full(n, 500.0))

    def broken(snap: SloSnapshot) -> str:
        raise RuntimeError("no capacity")

    decisions: list[dict] = []
    w = CloudWatcher("m", SloTarget(100.0), probe, broken, SETTINGS, requests=20, warmup=3,
                     on_decision=decisions.append)
    first = w.check(now=0.0)
    assert probe.sent == 23 and first.snapshot is not None and first.snapshot.requests == 20
    second = w.check(now=1.0)
    assert second.decision is not None and second.decision["outcome"] == "failed: RuntimeError: no capacity"
    assert decisions == [second.decision] and w.status()["replans"] == 1 and len(w.window) == 0


def test_settings_default_for_probing_and_read_the_environment() -> None:
    s = cloud_settings({})
    assert s == CLOUD_DEFAULTS and probes_per_check({}) == 20
    # the window's minimum is reachable: a few checks' probes fill it
    assert s.min_requests <= 2 * probes_per_check({}) <= s.window_requests
    s = cloud_settings({"FLATPACK_WATCH_EVERY_S": "0.5", "FLATPACK_WATCH_MIN_REQUESTS": "5"})
    assert (s.every_s, s.min_requests, s.window_requests) == (0.5, 5, CLOUD_DEFAULTS.window_requests)
    assert probes_per_check({"FLATPACK_WATCH_PROBES": "7"}) == 7
    for bad in ("0", "2.5", "many"):
        with pytest.raises(ValueError, match="FLATPACK_WATCH_PROBES"):
            probes_per_check({"FLATPACK_WATCH_PROBES": bad})
    with pytest.raises(ValueError, match="FLATPACK_WATCH_CHECKS"):
        cloud_settings({"FLATPACK_WATCH_CHECKS": "-1"})


# --------------------------------------------------------------------------------------------------------
# The record and the command, against a real endpoint in this process
# --------------------------------------------------------------------------------------------------------


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLATPACK_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("FLATPACK_API_TOKEN", raising=False)
    for k in ("EVERY_S", "CHECKS", "MIN_REQUESTS", "WINDOW_REQUESTS", "WINDOW_S", "COOLDOWN_S", "PROBES"):
        monkeypatch.delenv(f"FLATPACK_WATCH_{k}", raising=False)
    return tmp_path / "state"


@pytest.fixture
def gateway_record(state: Path, tmp_path: Path) -> Iterator[Callable[[float | None], str]]:
    """A model served over HTTP in this process, and a function that records it as an OpenFaaS deployment
    whose endpoint is that server (the gateway's route to the master speaks the same protocol) with the SLO
    given (None: no SLO); it returns the deployment's name."""
    from partitioner.export import export_bundle
    from serving.api import DataPlane, InProcessBackend, create_app
    from serving.api.server import AppServer
    from serving.deploy.state import DeploymentRecord

    path = tmp_path / "m.onnx"
    onnx.save(conv_stack([{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 4}], cin=3, h=8, w=8), str(path))
    bundle = export_bundle(path, "0-:none", tmp_path / "bundle")
    plane = DataPlane()
    plane.add(InProcessBackend(bundle, name="m"))
    with AppServer(create_app(plane, token="")) as server:
        def record(slo_ms: float | None) -> str:
            options = {"cloud": {}} if slo_ms is None else {"cloud": {}, "slo": {"slo_ms": slo_ms, "percentile": None}}
            DeploymentRecord(name="m", model=str(path), bundle=str(bundle), target="openfaas", transport="inline",
                             endpoint=server.url, status="ready", options=options).save()
            return "m"

        yield record


def _invoke(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["watch", *args], terminal_width=200)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res.exit_code, res.output


def _watch_doc(state: Path) -> dict:
    return json.loads((state / "deployments" / "m.json").read_text())["options"].get("watch", {})


def test_watch_once_exits_0_when_the_slo_holds_and_2_when_it_misses(gateway_record: Callable[[float | None], str],
                                                                  state: Path) -> None:
    gateway_record(60_000.0)
    code, out = _invoke("m", "--once", "--requests", "8")
    assert code == 0, out
    assert "mean" in out and "60000 ms SLO over the last 8 probes" in out and "holds" in out
    doc = _watch_doc(state)
    assert doc["last_check"]["missed"] is False and doc["last_check"]["live"]["requests"] == 8 and doc["replans"] == 0
    gateway_record(0.001)  # no request answers in a microsecond
    code, out = _invoke("m", "--once", "--requests", "8")
    assert code == 2, out
    assert "misses it" in out and _watch_doc(state)["last_check"]["missed"] is True


def test_watch_on_openfaas_reports_a_miss_and_swaps_nothing(gateway_record: Callable[[float | None], str],
                                                              state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gateway_record(0.001)
    monkeypatch.setenv("FLATPACK_WATCH_CHECKS", "2")
    monkeypatch.setenv("FLATPACK_WATCH_MIN_REQUESTS", "4")
    monkeypatch.setenv("FLATPACK_WATCH_WINDOW_REQUESTS", "8")
    w = cloud_watcher("m", settings=cloud_settings(), requests=4, warmup=1)
    try:
        assert w.check().decision is None  # the first miss: one of the two in a row
        entry = w.check().decision
    finally:
        w.close()
    assert entry is not None and entry["outcome"].startswith("not re-planned: on OpenFaaS a plan is an image")
    doc = _watch_doc(state)
    assert doc["replans"] == 1 and doc["last"] == entry and doc["history"] == [entry]
    # the command: a bounded run prints a line per check and the decision (at its first check: one miss is
    # enough here), and says it stopped
    monkeypatch.setenv("FLATPACK_WATCH_CHECKS", "1")
    code, out = _invoke("m", "--every", "0.01", "--requests", "4", "--for", "0.5s")
    assert code == 0, out
    assert "check 1:" in out and "re-plan" in out and "not re-planned" in out and "stopped watching m" in out
    assert "billed" in out
    assert _watch_doc(state)["state"] == "stopped" and _watch_doc(state)["replans"] >= 2


def test_watch_refuses_a_deployment_without_an_slo(gateway_record: Callable[[float | None], str], state: Path) -> None:
    gateway_record(None)
    for args in (("m",), ("m", "--once")):
        code, out = _invoke(*args)
        assert code == 1 and "has no SLO to watch" in out and "--slo" in out
    with pytest.raises(LookupError, match="no deployment named 'ghost'"):
        cloud_watcher("ghost")
    record_check("m", "last", {"reason": "r", "outcome": "o"})
    assert _watch_doc(state)["replans"] == 1

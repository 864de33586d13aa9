"""The SLO window, its figures, and the watch's decisions on synthetic latency streams (no clock, no sleeps)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import pytest

from serving.api.slo import LatencyWindow, SloTarget
from serving.deploy.watch import Hysteresis, Watcher, WatchSettings
from tests.onnx_builders import conv_stack

SETTINGS = WatchSettings(every_s=1.0, checks=3, min_requests=50, window_requests=100, window_s=1e9, cooldown_s=30.0)


def _run(stream: list[float], target: SloTarget, settings: WatchSettings = SETTINGS, *, per_check: int = 10
         ) -> list[tuple[int, str]]:
    """Feed ``stream`` into a window, a check every ``per_check`` requests one second apart; the re-plans
    (the request they came after, the reason). A re-plan starts the window again, as the watcher does."""
    window = LatencyWindow(settings.window_requests, settings.window_s)
    h = Hysteresis(settings)
    out = []
    for i, ms in enumerate(stream):
        window.add(ms, now=float(i))
        if (i + 1) % per_check == 0:
            reason = h.check(window.snapshot(target, now=float(i)), now=(i + 1) / per_check)
            if reason is not None:
                out.append((i, reason))
                window.clear()
    assert h.replans == len(out)
    return out


@pytest.mark.parametrize("target", [SloTarget(100.0, 0.95), SloTarget(100.0)], ids=["p95", "mean"])
def test_a_sustained_slowdown_re_plans_exactly_once(target: SloTarget) -> None:
    rng = np.random.default_rng(0)
    fast = list(rng.normal(50, 5, 300))
    slow = list(rng.normal(150, 10, 250))  # 25 checks, all missed; the cool-down is 30 checks
    replans = _run(fast + slow, target)
    assert len(replans) == 1
    at, reason = replans[0]
    assert 300 < at < 300 + 10 * 8  # a few checks into the slowdown: the window misses, then 3 checks in a row
    assert target.statistic in reason and "100 ms SLO" in reason


def test_noise_around_the_slo_with_attainment_above_target_does_not_re_plan() -> None:
    rng = np.random.default_rng(1)
    # 97 % within a p95 SLO: single requests miss it, and a window now and then has fewer than 95 % within
    stream = [float(x) for x in np.where(rng.random(3000) < 0.97, rng.normal(80, 8, 3000), 130.0)]
    snaps = []
    w = LatencyWindow(100)
    for i, x in enumerate(stream):
        w.add(x, now=0.0)
        if i >= 100 and i % 10 == 0:
            snaps.append(w.snapshot(SloTarget(100.0, 0.95), now=0.0))
    assert any(not s.met for s in snaps if s is not None)  # the noise does dip below the target
    assert _run(stream, SloTarget(100.0, 0.95)) == []
    # a mean SLO: single requests far above it, the window's mean around 80 % of it
    stream = [float(x) for x in np.where(rng.random(3000) < 0.9, 60.0, 250.0)]
    assert _run(stream, SloTarget(100.0)) == []


def test_a_slowdown_shorter_than_the_hysteresis_does_not_re_plan() -> None:
    rng = np.random.default_rng(2)
    fast = list(rng.normal(50, 5, 300))

    def burst(checks: int) -> list[float]:  # slow for this many checks: windows of their own, one per check
        return fast + list(rng.normal(300, 10, 100 * checks)) + fast

    assert _run(burst(2), SloTarget(100.0), per_check=100) == []
    assert len(_run(burst(3), SloTarget(100.0), per_check=100)) == 1


def test_no_decision_on_too_few_requests_or_in_the_cool_down() -> None:
    h = Hysteresis(SETTINGS)
    w = LatencyWindow(50)
    for _ in range(10):
        w.add(500.0, now=0.0)
    snap = w.snapshot(SloTarget(100.0), now=0.0)
    assert snap is not None and not snap.met and snap.requests < SETTINGS.min_requests
    assert all(h.check(snap, now=float(t)) is None for t in range(10))
    for _ in range(40):
        w.add(500.0, now=0.0)
    full = w.snapshot(SloTarget(100.0), now=0.0)
    assert [h.check(full, now=100.0 + t) is not None for t in range(3)] == [False, False, True]
    assert all(h.check(full, now=103.0 + t) is None for t in range(20))  # 30 s of cool-down
    assert [h.check(full, now=140.0 + t) is not None for t in range(3)] == [False, False, True]


def test_window_figures_against_the_slo() -> None:
    w = LatencyWindow(max_requests=100, max_age_s=10.0)
    for i in range(100):
        w.add(float(i + 1), now=0.0)
    snap = w.snapshot(SloTarget(95.0, 0.95), now=0.0)
    assert snap is not None
    assert snap.requests == 100 and snap.attainment == pytest.approx(0.95) and snap.met
    assert snap.p50_ms == pytest.approx(50.5) and snap.mean_ms == pytest.approx(50.5)
    assert not w.snapshot(SloTarget(94.0, 0.95), now=0.0).met  # type: ignore[union-attr]
    assert w.snapshot(SloTarget(50.5), now=0.0).met  # type: ignore[union-attr]
    assert not w.snapshot(SloTarget(50.0), now=0.0).met  # type: ignore[union-attr]
    w.add(1.0, now=5.0)
    assert len(w.latencies(now=10.5)) == 1  # the first 100 are older than 10 s
    assert w.snapshot(SloTarget(1.0), now=20.0) is None
    with pytest.raises(ValueError, match="positive number"):
        SloTarget(0.0)
    assert SloTarget.from_options({"slo_ms": 200, "percentile": 0.99}) == SloTarget(200.0, 0.99)
    assert SloTarget.from_options(None) is None


def test_settings_from_the_environment() -> None:
    s = WatchSettings.from_env({"FLATPACK_WATCH_EVERY_S": "0.2", "FLATPACK_WATCH_CHECKS": "2",
                                "FLATPACK_WATCH_MIN_REQUESTS": "", "FLATPACK_WATCH_COOLDOWN_S": "0"})
    assert (s.every_s, s.checks, s.min_requests, s.cooldown_s) == (0.2, 2, 100, 0.0)
    with pytest.raises(ValueError, match="FLATPACK_WATCH_CHECKS"):
        WatchSettings.from_env({"FLATPACK_WATCH_CHECKS": "2.5"})
    with pytest.raises(ValueError, match="FLATPACK_WATCH_EVERY_S"):
        WatchSettings.from_env({"FLATPACK_WATCH_EVERY_S": "soon"})
    with pytest.raises(ValueError, match="min_requests"):
        WatchSettings.from_env({"FLATPACK_WATCH_WINDOW_REQUESTS": "10"})


@pytest.fixture
def served(tmp_path: Path):  # type: ignore[no-untyped-def]
    from partitioner.export import export_bundle
    from serving.api import DataPlane, InProcessBackend, create_app
    from serving.api.server import AppServer

    path = tmp_path / "m.onnx"
    onnx.save(conv_stack([{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 4}], cin=3, h=8, w=8), str(path))
    plane = DataPlane(window_requests=50)
    plane.add(InProcessBackend(export_bundle(path, "0-:none", tmp_path / "bundle"), name="m"))
    with AppServer(create_app(plane, token="")) as s:
        yield plane, s.url


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:  # noqa: S310 - a loopback test server
        return r.read().decode()


def test_the_endpoint_shows_the_slo_and_its_live_figures(served) -> None:  # type: ignore[no-untyped-def]
    from serving.api.client import InferClient

    plane, url = served
    assert json.loads(_get(f"{url}/v2/models/m/slo"))["slo"] is None
    plane.set_slo("m", SloTarget(10_000.0, 0.95))
    doc = json.loads(_get(f"{url}/v2/models/m/slo"))
    assert doc["slo"]["requests"] == 0 and doc["window"]["requests"] == 50
    x = {"input": np.zeros((1, 3, 8, 8), np.float32)}
    with InferClient(url, "m") as c:
        for _ in range(5):
            c.infer(x)
    doc = json.loads(_get(f"{url}/v2/models/m/versions/1/slo"))
    slo = doc["slo"]
    assert slo["requests"] == 5 and slo["attainment"] == 1.0 and slo["met"] is True
    assert 0 < slo["p50_ms"] <= slo["p95_ms"] <= slo["p99_ms"]
    metrics = _get(f"{url}/metrics")
    assert 'flatpack_slo_ms{model="m",statistic="p95"} 10000.0' in metrics
    assert 'flatpack_slo_attainment{model="m"} 1.0' in metrics
    assert 'flatpack_live_latency_ms{model="m",quantile="0.99"}' in metrics
    # a watcher reports through the same document; a swap starts the window again
    calls = []
    watcher = Watcher(plane, "m", lambda s: calls.append(s) or "kept", SETTINGS)
    plane.set_extra("m", "watch", watcher.status)
    assert json.loads(_get(f"{url}/v2/models/m/slo"))["watch"]["replans"] == 0
    plane.swap(plane.model("m"))
    assert json.loads(_get(f"{url}/v2/models/m/slo"))["slo"]["requests"] == 0


def test_the_watcher_re_plans_on_the_planes_window_and_records_it(served) -> None:  # type: ignore[no-untyped-def]
    plane, _ = served
    plane.set_slo("m", SloTarget(100.0))
    decisions: list[dict] = []
    armed = [False]
    watcher = Watcher(plane, "m", lambda s: f"replanned at {s.statistic_ms:.0f} ms", SETTINGS,
                      armed=lambda: armed[0], on_decision=decisions.append)
    for _ in range(60):
        plane.observe("m", 500.0)
    assert watcher.step(now=0.0) is None and not watcher.status()["armed"]
    armed[0] = True
    assert watcher.step(now=1.0) is None  # arming starts the window again: the live check's probes are not users
    for t in range(3):
        for _ in range(60):
            plane.observe("m", 500.0)
        entry = watcher.step(now=2.0 + t)
    assert entry is not None and entry["outcome"] == "replanned at 500 ms" and decisions == [entry]
    assert len(plane.window("m")) == 0 and watcher.status()["replans"] == 1

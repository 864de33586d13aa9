"""The platform profile loader: the shipped profiles, a profile written inline, and what it refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from platforms import (
    PROFILE_DIR,
    MemoryRange,
    PlatformProfile,
    load_profile,
    load_profile_data,
    profile_names,
    resolve_profile_path,
)

MINIMAL: dict[str, Any] = {
    "name": "tiny",
    "memory_mb": {"min": 128, "max": 1024, "step": 64},
    "mb_per_vcpu": 1024,
    "max_vcpu": 2,
    "price_per_gb_s": 1e-5,
    "price_per_request": 2e-7,
    "billing_granularity_ms": 100,
    "payload_limit_bytes": 1000,
    "timeout_max_s": 60,
    "invoke_latency_ms": {"mu": 10, "sigma": 2, "tau": 5},
    "bandwidth_mb_s": 100,
    "max_concurrency": 10,
    "shared_memory": False,
}


def _write(tmp_path: Path, doc: object, name: str = "tiny.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("name", ["aws-lambda", "local", "openfaas"])
def test_every_shipped_profile_loads_by_name_and_by_path(name: str) -> None:
    assert name in profile_names()
    path = resolve_profile_path(name)
    assert path == PROFILE_DIR / f"{name}.yaml"
    by_name, by_path = load_profile(name), load_profile(path)
    assert by_name == by_path and by_name.name == name
    assert by_name.memory.min_mb <= by_name.memory.max_mb and by_name.mb_per_vcpu > 0
    assert load_profile_data(name)["name"] == name


def test_a_profile_written_inline_loads_with_its_defaults(tmp_path: Path) -> None:
    p = load_profile(_write(tmp_path, MINIMAL))
    assert p.memory == MemoryRange(128, 1024, 64)
    assert p.async_payload_limit_bytes == 1000  # defaults to the synchronous limit
    assert p.invoke_latency.mean == 15.0
    assert (p.transports, p.cold_start_ms, p.cpu_share, p.dispatch_ms, p.handling_ms, p.stage_overhead_ms) == (
        {}, None, {}, {}, None, None)
    assert p.vcpus(512) == 0.5 and p.vcpus(4096) == 2.0  # capped at max_vcpu
    assert p.billed_ms(130) == 200 and p.billed_ms(0) == 100
    assert p.cost(1024, 100, requests=1) == pytest.approx(0.1 * 1e-5 + 2e-7)


def test_optional_calibrated_fields_are_read(tmp_path: Path) -> None:
    doc = {**MINIMAL, "transports": {"shm": {"latency_ms": 0.1, "bandwidth_mb_s": 2000}},
           "cold_start_ms": 250, "cpu_share": {512: 2.1}, "dispatch_ms": 0.4, "handling_ms": 0.2,
           "stage_overhead_ms": 0.35, "jitter_sigma": 0.05}
    p = load_profile(_write(tmp_path, doc))
    assert p.transports["shm"].bandwidth_mb_s == 2000 and p.cold_start_ms == 250
    assert p.cpu_share == {512: 2.1} and p.handling_ms == 0.2 and p.jitter_sigma == 0.05
    assert p.stage_overhead_ms == 0.35
    assert p.dispatch_ms == {1024: 0.4}  # one number is one vCPU's figure
    per_size = load_profile(_write(tmp_path, {**doc, "dispatch_ms": {256: 1.5, 1024: 0.4}}, "sized.yaml"))
    assert per_size.dispatch_ms == {256: 1.5, 1024: 0.4}


def test_memory_outside_the_offered_sizes_is_refused() -> None:
    mem = MemoryRange(128, 1024, 64)
    mem.check(192)
    for bad in (64, 200, 2048):
        with pytest.raises(ValueError, match=f"memory {bad} MB is not offered: choose 128..1024 MB in steps of 64"):
            mem.check(bad)
    assert list(mem.options())[:3] == [128, 192, 256]


def test_errors_name_the_file_and_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no platform profile 'nimbus'; known: \['aws-lambda'"):
        resolve_profile_path("nimbus")
    with pytest.raises(ValueError, match="no platform profile"):
        load_profile(tmp_path / "absent.yaml")
    missing = {k: v for k, v in MINIMAL.items() if k != "mb_per_vcpu"}
    with pytest.raises(ValueError, match=r"missing.yaml: missing field 'mb_per_vcpu'"):
        load_profile(_write(tmp_path, missing, "missing.yaml"))
    with pytest.raises(ValueError, match=r"bad.yaml: could not convert string to float"):
        load_profile(_write(tmp_path, {**MINIMAL, "price_per_gb_s": "cheap"}, "bad.yaml"))
    with pytest.raises(ValueError, match=r"list.yaml: a platform profile is a YAML mapping"):
        load_profile(_write(tmp_path, [1, 2], "list.yaml"))
    assert PlatformProfile.from_dict(MINIMAL).name == "tiny"


@pytest.mark.parametrize("profile", ["aws-lambda", "openfaas", "local"])
def test_the_meter_the_simulator_and_the_model_bill_by_one_rule(profile: str) -> None:
    """One billing rule: what the local platform's meter bills an invocation (the profile's ``billed_ms``) is
    what the simulator bills it, and the performance model's expected bill for a spread of durations is
    their mean bill within a tenth of a step."""
    from bench.sim.simulator import SimPlatform
    from partitioner.perfmodel import PlatformFacts

    p = load_profile(profile)
    sim = SimPlatform(granularity_ms=p.billing_granularity_ms)
    facts = PlatformFacts.from_profile(p)
    g = p.billing_granularity_ms
    for ms in (0.0, 0.3, 1.0, 4.2, 99.99, 100.0, 130.0):
        assert sim.billed_ms(ms) == p.billed_ms(ms) >= ms
        assert p.billed_ms(ms) >= g  # at least one step
    rng = np.random.default_rng(0)
    for mean in (4.2, 37.0, 130.0):
        runs = mean * rng.lognormal(0.0, 0.2, 20_000) / np.exp(0.02)
        metered = float(np.mean([p.billed_ms(x) for x in runs]))
        assert facts.billed_ms(float(np.mean(runs))) == pytest.approx(metered, abs=0.1 * g if g <= 1 else 0.25 * g)

"""How a platform sells CPU (``cpu`` in a profile): parsing, what it refuses, and every side that reads
it without a running platform: the function's vCPU and threads, billing, the local platform's shares,
function specs, the meter and the OpenFaaS rendering."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from platforms import CpuModel, PlatformProfile, load_profile
from serving.platform.cpu import CpuShare, make_limiter
from serving.platform.meter import Meter
from serving.platform.spec import FunctionSpec
from tests.platforms.test_profile import MINIMAL

PER_FUNCTION = {"model": "per_function", "default_vcpu": 1.0, "min_vcpu": 0.1, "max_vcpu": 4}


def _profile(cpu: Any, **extra: Any) -> PlatformProfile:
    return PlatformProfile.from_dict({**MINIMAL, "cpu": cpu, **extra}, origin="tiny.yaml")


def test_the_shipped_profiles_say_how_they_sell_cpu() -> None:
    assert load_profile("aws-lambda").cpu == CpuModel("follows_memory")
    assert load_profile("local").cpu.model == "follows_memory"
    faas = load_profile("openfaas").cpu
    assert faas.per_function and faas.default_vcpu == 1.0 and faas.min_vcpu == 0.1 and faas.max_vcpu == 8.0
    assert faas.price_per_vcpu_s == 0.0  # self-hosted: not priced apart from memory
    for name in ("aws-lambda", "local", "openfaas"):
        assert "cpu" in load_profile(name).sources


def test_a_profile_without_cpu_follows_memory() -> None:
    p = PlatformProfile.from_dict(MINIMAL)
    assert p.cpu == CpuModel() and not p.cpu.per_function
    assert p.function_vcpu(512) == p.vcpus(512) == 0.5


def test_cpu_follows_memory_or_is_the_functions_own() -> None:
    lam = _profile({"model": "follows_memory"})
    assert lam.function_vcpu(1024) == 1.0 and lam.function_threads(1536) == 2
    with pytest.raises(ValueError, match="follows memory"):
        lam.function_vcpu(1024, 0.5)
    faas = _profile(PER_FUNCTION)
    assert faas.function_vcpu(128) == faas.function_vcpu(1024) == 1.0  # the default, whatever the memory
    assert faas.function_vcpu(128, 2.5) == 2.5 and faas.function_threads(128, 2.5) == 3
    assert faas.function_vcpu(128, 2.5, cores=2) == 2.0  # a local instance: this machine's cores
    for bad in (0.05, 5.0, 0.0):
        with pytest.raises(ValueError, match="not offered: choose 0.1..4 vCPU"):
            faas.function_vcpu(256, bad)


def test_billing_is_memory_x_time_plus_cpu_x_time_where_cpu_is_priced() -> None:
    plain = _profile(PER_FUNCTION)
    assert plain.billed_vcpu_s(2.0, 250) == 0.0
    assert plain.cost(1024, 250) == pytest.approx(1 * 0.3 * 1e-5 + 2e-7)  # 100 ms granularity: 300 ms
    priced = _profile({**PER_FUNCTION, "price_per_vcpu_s": 1e-5})
    assert priced.billed_vcpu_s(2.0, 250) == pytest.approx(0.6)
    assert priced.cost(1024, 250, vcpu=2.0) == pytest.approx(0.3e-5 + 0.6e-5 + 2e-7)
    assert priced.cost(1024, 250) == pytest.approx(0.3e-5 + 0.3e-5 + 2e-7)  # the default vCPU


@pytest.mark.parametrize(("cpu", "error"), [
    ({"model": "bursty"}, r"cpu\.model 'bursty' is not one of follows_memory, per_function"),
    ({"default_vcpu": 1}, r"cpu\.model is missing"),
    ({"model": "per_function"}, r"needs cpu\.default_vcpu"),
    ({**PER_FUNCTION, "default_vcpu": 8}, r"default_vcpu 8.0 is outside"),
    ({**PER_FUNCTION, "min_vcpu": 5}, r"min_vcpu 5.0 exceeds cpu\.max_vcpu 4.0"),
    ({**PER_FUNCTION, "max_vcpu": -1}, r"cpu\.max_vcpu must be positive"),
    ({**PER_FUNCTION, "price_per_vcpu_s": -1}, r"price_per_vcpu_s must be >= 0"),
    ({**PER_FUNCTION, "default_vcpu": "one"}, r"cpu\.default_vcpu must be a number, got 'one'"),
    ({**PER_FUNCTION, "burst": 2}, r"unknown field\(s\) \['burst'\]"),
    ({"model": "follows_memory", "default_vcpu": 1}, r"belong to a per_function CPU model"),
    ("per_function", r"cpu must be a mapping"),
])
def test_a_bad_cpu_model_names_the_file_and_the_field(cpu: Any, error: str) -> None:
    with pytest.raises(ValueError, match=rf"^tiny\.yaml: field cpu: .*{error}"):
        _profile(cpu)


def test_a_profile_file_with_a_bad_cpu_model_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**MINIMAL, "cpu": {"model": "per_function"}}))
    with pytest.raises(ValueError, match=rf"^{path}: field cpu: "):
        load_profile(path)


def test_the_local_platforms_share_is_the_functions_vcpu_where_it_has_one() -> None:
    for kind in ("off", "dilation"):
        limiter = make_limiter(kind, mb_per_vcpu=1769, max_vcpu=None, cores=4, cpu_model="per_function")
        assert limiter.describe()["cpu_model"] == "per_function" and limiter.describe()["mb_per_vcpu"] is None
        if kind == "dilation":
            assert limiter.share(8192, 0.5) == CpuShare(0.5, 1)  # not 8192 / 1769
            assert limiter.attach("f-1", 8192, 0.5).env == {"FLATPACK_CPU_SHARE": "0.500000"}
            assert limiter.share(128, 6.0) == CpuShare(4.0, 4)  # this machine's cores
        else:
            assert limiter.share(8192, 0.5) == CpuShare(1.0, 1)  # off: whole threads
        assert limiter.share(1769).threads == 1  # without a vCPU of its own: memory's share, as before


def test_a_spec_carries_a_vcpu_and_refuses_a_bad_one() -> None:
    spec = FunctionSpec.from_json({"name": "f", "memory_mb": 256, "vcpu": 0.5})
    assert spec.vcpu == 0.5 and FunctionSpec.from_json(spec.to_json()) == spec
    assert FunctionSpec("g", 256).to_json()["vcpu"] is None
    for bad in (0, -1, float("inf")):
        with pytest.raises(ValueError, match="vcpu must be a positive number"):
            FunctionSpec("f", 256, vcpu=bad)
    for bad_json in ("1", True, [1]):
        with pytest.raises(ValueError, match="vcpu must be a number"):
            FunctionSpec.from_json({"name": "f", "memory_mb": 256, "vcpu": bad_json})
    # a description registered back: the share the platform reports is not a setting
    described = {**spec.to_json(), "share_vcpu": 0.5, "intra_op_threads": 1, "instances": []}
    assert FunctionSpec.from_json(described) == spec


def test_the_meter_bills_vcpu_seconds_where_cpu_is_per_function() -> None:
    meter = Meter(_profile({**PER_FUNCTION, "price_per_vcpu_s": 2e-5}))
    meter.record("faas", 1024, 250.0, vcpu=2.0)  # billed 300 ms
    meter.record("faas", 1024, 50.0, vcpu=2.0)  # billed 100 ms
    meter.record("lambda-like", 1024, 250.0)
    snap = meter.snapshot()
    faas = snap["functions"]["faas"]  # type: ignore[index]
    assert faas["vcpu"] == 2.0 and faas["billed_vcpu_s"] == pytest.approx(0.8)
    assert faas["billed_gb_s"] == pytest.approx(0.4)
    assert faas["cost_usd"] == pytest.approx(0.4 * 1e-5 + 2 * 2e-7 + 0.8 * 2e-5)
    other = snap["functions"]["lambda-like"]  # type: ignore[index]
    assert other["vcpu"] is None and other["billed_vcpu_s"] == 0.0
    assert snap["total"]["billed_vcpu_s"] == pytest.approx(0.8)  # type: ignore[index]
    assert b'flatpack_billed_vcpu_seconds_total{function="faas"} 0.8' in meter.prometheus_text()


def test_openfaas_renders_each_functions_cpu_apart_from_its_memory(tmp_path: Path) -> None:
    from functions.plan import Plan
    from serving.deploy.openfaas import OpenFaaSOptions, OpenFaaSStack, function_deployment, render_openfaas_stack
    from tests.conftest import conv_channel_bundle

    bundle = conv_channel_bundle(tmp_path / "bundle", memory_mb=3072)
    plan = Plan.load(bundle / "plan.json")
    names = sorted(f.name for f in plan.functions)
    own = {names[0]: 2.5}
    stack = render_openfaas_stack(bundle, tmp_path / "st", deployment="cpu", options=OpenFaaSOptions(vcpu=own))
    doc = yaml.safe_load((tmp_path / "st" / "stack.yml").read_text())
    for f in plan.functions:
        spec = doc["functions"][f"cpu-{f.name}"]
        want = own.get(f.name, 1.0)  # else the profile's default, not 3072 MB / 1024 MB per vCPU
        assert spec["limits"] == spec["requests"] == {"memory": f"{f.memory_mb}Mi", "cpu": f"{round(want * 1000)}m"}
        assert spec["environment"]["FLATPACK_INTRA_OP_THREADS"] == str(-(-want // 1)).removesuffix(".0")
    again = OpenFaaSStack.load(tmp_path / "st")
    assert [again.resources(f) for f in again.functions] == [stack.resources(f) for f in stack.functions]
    assert all(function_deployment(again, f)["limits"]["cpu"] == stack.resources(f)["cpu"] for f in again.functions)
    with pytest.raises(ValueError, match=r"function .*: vcpu 9.0 is not offered: choose 0.1..8 vCPU"):
        render_openfaas_stack(bundle, tmp_path / "bad", deployment="cpu", options=OpenFaaSOptions(vcpu={names[0]: 9}))
    with pytest.raises(ValueError, match="which the plan does not have"):
        render_openfaas_stack(bundle, tmp_path / "bad2", deployment="cpu", options=OpenFaaSOptions(vcpu={"nope": 1}))

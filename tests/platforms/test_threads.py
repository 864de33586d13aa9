"""Threads per memory come from one function (``platforms.threads_for``): what the planner assumes a function
of M MB runs with is what each deployer renders for it and what the local platform starts it with."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from platforms import load_profile, threads_for
from serving.deploy.lambda_service import LambdaOptions, render_lambda_service
from serving.deploy.openfaas import render_openfaas_stack
from serving.platform.cpu import make_limiter
from tests.conftest import conv_channel_bundle

MEMORIES = (1769, 2560, 3538, 10240)  # one vCPU on Lambda, between one and two, two, Lambda's largest

# Lambda: ceil(M / MB per vCPU), capped by the platform's vCPUs and never by the planning machine's cores;
# OpenFaaS sells CPU per function: the profile's default vCPU (1) whatever the memory
EXPECTED = {
    "aws-lambda": {1769: 1, 2560: 2, 3538: 2, 10240: 6},
    "openfaas": {1769: 1, 2560: 1, 3538: 1, 10240: 1},
}


def _lambda_threads(bundle: Path, out: Path) -> dict[int, int]:
    render_lambda_service(bundle, out, deployment="th", options=LambdaOptions(vendor=False))
    doc = yaml.safe_load((out / "flatpack.yml").read_text())
    common = doc["provider"]["environment"]
    return {f["memorySize"]: int({**common, **f["environment"]}["FLATPACK_INTRA_OP_THREADS"])
            for f in doc["functions"].values()}


def _openfaas_threads(bundle: Path, out: Path) -> dict[int, int]:
    render_openfaas_stack(bundle, out, deployment="th")
    doc = yaml.safe_load((out / "stack.yml").read_text())
    return {int(f["limits"]["memory"].removesuffix("Mi")): int(f["environment"]["FLATPACK_INTRA_OP_THREADS"])
            for f in doc["functions"].values()}


RENDERERS = {"aws-lambda": _lambda_threads, "openfaas": _openfaas_threads}


@pytest.mark.parametrize("memory_mb", MEMORIES)
@pytest.mark.parametrize("platform", sorted(RENDERERS))
def test_a_deployed_function_runs_the_threads_it_was_planned_with(platform: str, memory_mb: int,
                                                                  tmp_path: Path) -> None:
    bundle = conv_channel_bundle(tmp_path / "bundle", memory_mb=memory_mb)
    rendered = RENDERERS[platform](bundle, tmp_path / "out")
    planned = load_profile(platform).function_threads(memory_mb)
    assert rendered == {memory_mb: planned}
    assert planned == EXPECTED[platform][memory_mb]


def test_openfaas_sells_the_cpu_the_threads_were_counted_from(tmp_path: Path) -> None:
    bundle = conv_channel_bundle(tmp_path / "bundle", memory_mb=2560)
    render_openfaas_stack(bundle, tmp_path / "out", deployment="th")
    doc = yaml.safe_load((tmp_path / "out" / "stack.yml").read_text())
    p = load_profile("openfaas")
    cpu = f"{round(p.function_vcpu(2560) * 1000)}m"
    assert {f["limits"]["cpu"] for f in doc["functions"].values()} == {cpu} == {"1000m"}
    assert {f["requests"]["cpu"] for f in doc["functions"].values()} == {cpu}


@pytest.mark.parametrize("memory_mb", MEMORIES)
@pytest.mark.parametrize("mechanism", ["off", "dilation"])
@pytest.mark.parametrize("profile", ["local", "aws-lambda"])
def test_the_local_platform_starts_an_instance_with_the_planned_threads(profile: str, mechanism: str,
                                                                        memory_mb: int) -> None:
    """The local platform's instances run here, so this machine's cores cap them (whatever profile it emulates)."""
    p = load_profile(profile)
    for cores in (2, 16):
        limiter = make_limiter(mechanism, mb_per_vcpu=p.mb_per_vcpu, max_vcpu=p.max_vcpu, cores=cores)
        assert limiter.share(memory_mb).threads == p.threads(memory_mb, cores=cores)
        assert p.threads(memory_mb, cores=cores) == min(cores, EXPECTED["aws-lambda"][memory_mb])


def test_threads_are_the_ceiling_of_the_vcpus_at_least_one() -> None:
    assert threads_for(128, 1769, 6) == 1  # 0.07 vCPU
    assert threads_for(1769, 1769, 6) == 1 and threads_for(1770, 1769, 6) == 2
    assert threads_for(20_000, 1769, 6) == 6
    assert threads_for(20_000, 1769, 6, cores=4) == 4
    assert threads_for(20_000, 1769, None, cores=3) == 3


def test_one_vcpu_is_an_offered_size() -> None:
    assert [load_profile(n).one_vcpu_mb for n in ("aws-lambda", "openfaas", "local")] == [1769, 1024, 1769]

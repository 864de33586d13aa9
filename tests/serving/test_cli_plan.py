"""`flatpack plan`: the cap on a group's length that it planned under is in its output, text and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from serving.cli import main
from tests.onnx_builders import conv_stack

LAYERS = [{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 4}] * 6


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "convs.onnx"
    onnx.save(conv_stack(LAYERS, cin=3, h=16, w=16), str(path))
    return path


def _plan(model: Path, *args: str) -> dict:
    result = CliRunner().invoke(main, ["plan", str(model), "--mode", "lo", "--profile", "flops", "--memory", "1769",
                                       "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_plan_searches_every_unit_by_default_and_says_so(model: Path) -> None:
    data = _plan(model)
    assert data["max_group"] == 6
    assert data["notes"][0] == "groups of up to 6 units (all of them)"


def test_max_group_caps_the_groups_and_the_plan_says_so(model: Path) -> None:
    data = _plan(model, "--max-group", "2")
    assert data["max_group"] == 2
    assert data["notes"][0] == "groups of up to 2 of the model's 6 units (set by --max-group 2)"


def test_the_text_output_and_help_state_the_cap(model: Path) -> None:
    text = CliRunner().invoke(main, ["plan", str(model), "--mode", "lo", "--profile", "flops"], terminal_width=200)
    assert text.exit_code == 0, text.output
    assert "groups of up to 6 units (all of them)" in text.output
    help_text = CliRunner().invoke(main, ["plan", "--help"], terminal_width=200).output
    assert "--max-group N" in help_text and "Default: any number" in help_text


def test_every_stage_says_where_its_time_comes_from_and_the_percentile_is_sampled(model: Path) -> None:
    data = _plan(model, "--percentile", "99")
    assert {s["times"] for s in data["stages"]} <= {"unit times", "predicted"}
    # the solvers check the bound; the plan reports the percentile sampled from its stages, below it
    assert data["latency_ms"] < data["latency_p_ms"] <= data["latency_p_bound_ms"]


@pytest.mark.parametrize(("args", "message"), [
    (["--hedge", "p100"], "percentile from p50"),
    (["--hedge", "often"], "percentile from p50"),
    (["--hedge", "p95", "--target", "lambda", "--dry-run"], "--hedge is for the local target"),
    (["--profile-budget", "-1"], "-1"),
])
def test_deploy_refuses_a_bad_hedge_or_budget_before_planning(model: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["deploy", str(model), "--no-calibrate", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_a_stage_timed_past_the_measured_threads_is_marked_extrapolated(model: Path) -> None:
    """A 10,240 MB Lambda function computes with six threads; the units were timed with one and two (FLOPs'
    stand-in the same): its figure is Amdahl's law beyond them, and the plan says so. At one vCPU it is not."""
    big = CliRunner().invoke(main, ["plan", str(model), "--mode", "lo", "--profile", "flops", "--memory", "10240",
                                    "--platform", "aws-lambda", "--json"])
    assert big.exit_code == 0, big.output
    (stage,) = {s["times"] for s in json.loads(big.stdout)["stages"]}
    assert stage.endswith("extrapolated to 6 threads (measured up to 2)")
    assert not any("extrapolated" in s["times"] for s in _plan(model)["stages"])

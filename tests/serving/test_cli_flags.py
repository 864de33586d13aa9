"""Every planning flag in every mode: honoured (its effect visible in the plan) or refused with one line;
an unmeetable SLO exits 2 with the fastest plan, from `plan` and from `deploy` alike."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner, Result

from serving.cli import main
from tests.onnx_builders import conv_stack


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three small convolutions: every mode plans them in well under a second."""
    conv = {"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 4}
    path = tmp_path_factory.mktemp("flags") / "convs.onnx"
    onnx.save(conv_stack([conv] * 3, cin=3, h=16, w=16), str(path))
    return path


def _run(model: Path, mode: str, *args: str, command: str = "plan") -> Result:
    extra = ["--json"] if command == "plan" else ["--no-calibrate", "--platform", "local"]
    return CliRunner().invoke(main, [command, str(model), "--mode", mode, "--profile", "flops", *extra, *args],
                              terminal_width=200)


def _plan(model: Path, mode: str, *args: str) -> dict:
    result = _run(model, mode, *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _refused(result: Result, words: str) -> None:
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output


# -- lo ---------------------------------------------------------------------------------------------------

def test_lo_honours_memory_percentile_and_max_group(model: Path) -> None:
    assert _plan(model, "lo", "--memory", "1024")["master_mb"] == 1024
    assert _plan(model, "lo", "--percentile", "99")["percentile"] == 0.99
    assert _plan(model, "lo", "--max-group", "1")["max_group"] == 1


def test_lo_checks_the_slo(model: Path) -> None:
    fastest = _plan(model, "lo")
    assert _plan(model, "lo", "--slo", f"{fastest['latency_ms'] * 2:.1f}ms")["meets_slo"] is True
    missed = _run(model, "lo", "--slo", "1ms")
    assert missed.exit_code == 2
    data = json.loads(missed.stdout)
    assert data["meets_slo"] is False and "fastest" in data and "more than the 1 ms SLO" in data["error"]


def test_lo_refuses_a_solver(model: Path) -> None:
    _refused(_run(model, "lo", "--solver", "rl"), "--solver picks the SLO solver of --mode slo")


# -- slo --------------------------------------------------------------------------------------------------

def test_slo_honours_every_flag(model: Path) -> None:
    data = _plan(model, "slo", "--slo", "10s", "--memory", "512", "--solver", "bruteforce", "--percentile", "90",
                 "--max-group", "2")
    assert data["solver"] == "bruteforce" and data["master_mb"] == 512 and data["percentile"] == 0.9
    assert data["max_group"] == 2 and data["meets_slo"] is True
    assert {s["worker_mb"] for s in data["stages"]} == {512}


def test_slo_needs_an_slo_and_offered_memory(model: Path) -> None:
    _refused(_run(model, "slo"), "--mode slo needs a positive --slo")
    assert "not offered" in _run(model, "slo", "--slo", "1s", "--memory", "20000").output
    _refused(_run(model, "slo", "--slo", "1s", "--memory", "lots"), "give auto or a whole number of MB")


# -- mopar ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args,words", [
    (("--memory", "1024"), "--mode mopar sizes each function's memory itself"),
    (("--solver", "exact"), "--solver picks the SLO solver of --mode slo"),
    (("--max-group", "2"), "--mode mopar chooses its slices itself"),
    (("--percentile", "99"), "give --slo too"),
])
def test_mopar_refuses_what_it_decides_itself(model: Path, args: tuple[str, ...], words: str) -> None:
    _refused(_run(model, "mopar", *args), words)


def test_mopar_checks_the_slo_at_the_percentile_asked(model: Path) -> None:
    loose = _plan(model, "mopar", "--slo", "100s", "--percentile", "99")
    assert loose["meets_slo"] is True and loose["percentile"] == 0.99
    missed = _run(model, "mopar", "--slo", "1ms")
    assert missed.exit_code == 2
    error = json.loads(missed.stdout)["error"]
    assert "mopar" in error.lower() and "1.0 ms" in error


# -- deploy -----------------------------------------------------------------------------------------------

def test_deploy_with_an_unmeetable_slo_prints_the_fastest_plan_and_exits_2(model: Path) -> None:
    result = _run(model, "slo", "--slo", "1ms", "--name", "flags-unmeetable", command="deploy")
    assert result.exit_code == 2, result.output
    assert "no plan meets the SLO" in result.output and "the fastest plan" in result.output
    assert "predicted latency" in result.output and "Traceback" not in result.output


def test_deploy_refuses_a_flag_its_mode_ignores(model: Path) -> None:
    _refused(_run(model, "lo", "--solver", "bo", command="deploy"), "--solver picks the SLO solver")


# -- autoencoders (--compress ae) -------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["plan", "deploy"])
@pytest.mark.parametrize("mode,extra", [("lo", ()), ("slo", ("--slo", "10s"))])
def test_autoencoders_are_placed_by_mopar_alone(model: Path, command: str, mode: str, extra: tuple[str, ...]) -> None:
    _refused(_run(model, mode, "--compress", "ae:4", *extra, command=command),
             "places MOPAR's split-point autoencoders, which --mode mopar chooses")


@pytest.mark.parametrize("command,args,words", [
    ("plan", ("--max-accuracy-drop", "1%"), "--max-accuracy-drop is for the autoencoders of --compress ae"),
    ("deploy", ("--compress", "lz4", "--max-accuracy-drop", "1%"), "this command has --compress lz4"),
    ("plan", ("--calibration", "CALIB"), "--calibration is for the autoencoders of --compress ae"),
    ("plan", ("--compress", "ae", "--max-accuracy-drop", "lots"), "is not a number; write it as 0.5% or 0.005"),
    ("plan", ("--compress", "ae", "--max-accuracy-drop", "150%"), "must lie between 0 and 100%"),
    ("plan", ("--compress", "ae:1"), "the ratio after 'ae:' must be a number above 1"),
    ("plan", ("--compress", "lossless"), "a wire codec, chosen when deploying"),
    ("deploy", ("--compress", "ae", "--backend", "mxnet"), "drop one of the two"),
])
def test_autoencoder_flags_are_refused_where_they_do_not_apply(model: Path, tmp_path: Path, command: str,
                                                               args: tuple[str, ...], words: str) -> None:
    calib = tmp_path / "calib.npz"
    calib.write_bytes(b"")
    _refused(_run(model, "mopar", *(str(calib) if a == "CALIB" else a for a in args), command=command), words)


def test_a_model_without_labelled_data_gets_no_autoencoder_and_says_why(model: Path) -> None:
    data = _plan(model, "mopar", "--compress", "ae")
    assert data["autoencoders"] == [] and {s["sends"] for s in data["stages"]} == {"raw"}
    assert any("ships no labelled data" in n and "--calibration" in n for n in data["notes"])

"""The CLI on bad input: wrong flags, missing files, unwritable outputs, an SLO of "fast", unknown names.

Every case exits non-zero with one ``Error:`` line saying what is wrong (click puts its usage hint above a
usage error) and no traceback.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from tests.onnx_builders import mlp


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "mlp.onnx"
    onnx.save(mlp(), str(path))
    return path


CASES = {
    "slo fast": (["plan", "{model}", "--mode", "slo", "--slo", "fast"], "not a duration"),
    "slo missing": (["plan", "{model}", "--mode", "slo"], "--slo"),
    "mode unknown": (["plan", "{model}", "--mode", "fastest"], "fastest"),
    "flag unknown": (["plan", "{model}", "--mode", "lo", "--bogus"], "--bogus"),
    "max group zero": (["plan", "{model}", "--mode", "lo", "--max-group", "0"], "--max-group"),
    "model missing": (["plan", "{tmp}/missing.onnx", "--mode", "lo"], "no such file"),
    "plan unwritable": (["plan", "{model}", "--mode", "lo", "-o", "/proc/flatpack/plan.json"], "/proc"),
    "export unwritable": (["export", "{model}", "--stages", "0-:none", "-o", "/proc/flatpack-bundle"], "/proc"),
    "export bad spec": (["export", "{model}", "--stages", "0-99:spatial=9x9", "-o", "{tmp}/b"], "unit"),
    "verify missing": (["verify", "{tmp}/nothing"], "nothing"),
    "invoke unknown": (["invoke", "ghost"], "no deployment named 'ghost'"),
    "watch unknown": (["watch", "ghost"], "no deployment named 'ghost'"),
    "watch once unknown": (["watch", "ghost", "--once"], "no deployment named 'ghost'"),
    "watch for soon": (["watch", "ghost", "--for", "soon"], "not a duration"),
    "watch no probes": (["watch", "ghost", "--requests", "0"], "--requests"),
    "deploy watch without slo": (["deploy", "{model}", "--mode", "lo", "--target", "lambda", "--watch"], "--slo"),
    "bench load unknown": (["bench", "load", "ghost"], "ghost"),
    "chaos no clients": (["bench", "chaos", "--clients", "0"], "clients"),
    "chaos negative master kills": (["bench", "chaos", "--master-kills", "-1"], "--master-kills"),
    "soak no minutes": (["bench", "soak", "ghost"], "ghost"),
    "command unknown": (["deploy-everything"], "No such command"),
}


_PROGRESS = re.compile(r"\[ *\d+\.\d s\] ")


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_clear_line(case: str, model: Path, tmp_path: Path) -> None:
    argv, expect = CASES[case]
    argv = [a.format(model=model, tmp=tmp_path) for a in argv]
    env = {**os.environ, "FLATPACK_STATE_DIR": str(tmp_path / "state"), "FLATPACK_CACHE_DIR": str(tmp_path / "c")}
    res = subprocess.run([sys.executable, "-m", "serving.cli", *argv], capture_output=True, text=True, env=env,
                         timeout=120, check=False)
    assert res.returncode != 0, res.stdout
    assert "Traceback" not in res.stderr, res.stderr
    # progress lines (serving.console.status, where stderr is not a terminal) may come first; the rest is one line
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip() and not _PROGRESS.match(ln)]
    errors = [ln for ln in lines if ln.startswith("Error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], res.stderr
    assert len(lines) == 1 or lines[0].startswith("Usage:"), res.stderr
    assert expect in errors[0], res.stderr

"""What intake still refuses, through the CLI: a file whose dynamic dimensions nothing fixes, or fixes wrongly.
Each refusal is one ``Error:`` line naming the dimensions or inputs and the fix, and nothing is written; the
same file with its whole shape given by position exports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from zoo.intake import helper_models


@pytest.fixture(scope="module")
def anonymous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """x: ["?", 3, "?", "?"] (the names other exporters write for dimensions they leave open)."""
    h = next(h for h in helper_models() if h.name == "helper-anonymous-dims")
    path = tmp_path_factory.mktemp("intake") / "anon.onnx"
    onnx.save(h.model, str(path))
    return path


def _export(model: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLATPACK_STATE_DIR": str(out.parent / "state"), "FLATPACK_CACHE_DIR": str(out.parent / "c")}
    return subprocess.run([sys.executable, "-m", "serving.cli", "export", str(model), "--stages", "0-:none", "-o",
                           str(out), *extra], capture_output=True, text=True, env=env, timeout=120, check=False)


@pytest.mark.parametrize(("extra", "expect"), [
    ((), "dynamic input dimensions are not fixed: unnamed (x axis 2, x axis 3); pass --input-shape x=1x3xNxN"),
    (("--input-shape", "3=1x3x8x8"), "unknown input(s) ['3']; the model's inputs are ['x'] (or give them by "
                                     "position, 0 to 0)"),
    (("--input-shape", "1x3x8x12x5"), "--input-shape x has rank 5 but the model's input has rank 4"),
])
def test_a_refusal_is_one_line_naming_the_fix_and_writes_nothing(anonymous: Path, tmp_path: Path,
                                                                  extra: tuple[str, ...], expect: str) -> None:
    out = tmp_path / "bundle"
    res = _export(anonymous, out, *extra)
    assert res.returncode == 1, res.stdout
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and expect in lines[0], res.stderr
    assert not out.exists()


def test_the_whole_shape_given_by_position_exports(anonymous: Path, tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    res = _export(anonymous, out, "--input-shape", "1x3x8x12")
    assert res.returncode == 0, res.stderr
    assert (out / "plan.json").is_file()

"""The run's own tree (tests/hygiene.py) and ``--leak-check``, which fails a run that leaves files behind.

The leak check runs in a pytest subprocess whose home and "real" temporary directory are directories of
this test's own, so that nothing here touches the user's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from functions.settings import cache_dir, state_dir
from tests.conftest import PROJECT_ROOT, TEST_ROOT

CHILD = '''
import os
from pathlib import Path


def test_writes_where_it_is_told() -> None:
    for var in ("LEAK_HOME_FILE", "LEAK_TMP_FILE"):
        if os.environ.get(var):
            path = Path(os.environ[var])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("left behind")
'''


def _child_run(tmp_path: Path, **leaks: Path) -> subprocess.CompletedProcess[str]:
    home, real_tmp = tmp_path / "home", tmp_path / "real-tmp"
    home.mkdir(exist_ok=True)
    real_tmp.mkdir(exist_ok=True)
    (tmp_path / "test_child.py").write_text(CHILD)
    env = {**os.environ, "HOME": str(home), "FLATPACK_TEST_REAL_TMPDIR": str(real_tmp),
           "PYTHONPATH": str(PROJECT_ROOT)}
    for var, path in leaks.items():
        env[var] = str(path)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "tests.hygiene",
         "--rootdir", str(tmp_path), "--leak-check", str(tmp_path / "test_child.py")],
        env=env, capture_output=True, text=True, timeout=120, check=False)


def test_the_cache_state_and_temporary_directories_are_the_runs_own() -> None:
    assert cache_dir().is_relative_to(TEST_ROOT) and state_dir().is_relative_to(TEST_ROOT)
    assert Path(tempfile.gettempdir()).is_relative_to(TEST_ROOT)
    assert Path(os.environ["TMPDIR"]).is_relative_to(TEST_ROOT)


def test_an_onnxruntime_session_leaves_nothing_in_home(tmp_path: Path) -> None:
    """onnxruntime writes a device id under ``~/.cache/Microsoft`` the first time a process on the machine makes
    a session (on a fresh machine, the first test that does); the run points it into its own tree."""
    home = tmp_path / "home"
    home.mkdir()
    code = ("import onnx, onnxruntime as ort\n"
            "from onnx import TensorProto, helper\n"
            "x = helper.make_tensor_value_info('x', TensorProto.FLOAT, [1])\n"
            "y = helper.make_tensor_value_info('y', TensorProto.FLOAT, [1])\n"
            "g = helper.make_graph([helper.make_node('Relu', ['x'], ['y'])], 'g', [x], [y])\n"
            "ort.InferenceSession(helper.make_model(g).SerializeToString(), providers=['CPUExecutionProvider'])\n")
    subprocess.run([sys.executable, "-c", code], env={**os.environ, "HOME": str(home)}, check=True, timeout=120)
    assert Path(os.environ["XDG_CACHE_HOME"]).is_relative_to(TEST_ROOT)
    assert not list(home.rglob("*"))


def test_a_clean_run_passes_the_leak_check(tmp_path: Path) -> None:
    run = _child_run(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_run_that_leaves_files_in_home_or_tmp_fails(tmp_path: Path) -> None:
    home_file = tmp_path / "home" / ".cache" / "flatpack" / "zoo" / "model.onnx"
    tmp_dir = tmp_path / "real-tmp" / "SB3-2026-01-01" / "log.txt"
    run = _child_run(tmp_path, LEAK_HOME_FILE=home_file, LEAK_TMP_FILE=tmp_dir)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 passed" in run.stdout  # the tests passed; the leak failed the run
    assert str(home_file) in run.stdout and str(tmp_dir.parent) in run.stdout

"""``partitioner`` and ``partitioner.solvers`` name their public surface, and importing them stays cheap."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from tests.conftest import PROJECT_ROOT


@pytest.mark.parametrize("package", ["partitioner", "partitioner.solvers"])
def test_every_public_name_resolves_to_its_modules_object(package: str) -> None:
    pkg = importlib.import_module(package)
    assert pkg.__all__ == sorted(pkg._HOMES)
    for name in pkg.__all__:
        if name in ("rl_solver", "bo_solver"):
            pytest.importorskip({"rl_solver": "stable_baselines3", "bo_solver": "optuna"}[name])
        home = importlib.import_module(f"{package}.{pkg._HOMES[name]}")
        assert getattr(pkg, name) is getattr(home, name)
        assert name in home.__all__, f"{home.__name__} does not export {name}"
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        getattr(pkg, "nonexistent")  # noqa: B009 - the lookup is what is tested


def test_importing_the_packages_loads_no_heavy_dependency() -> None:
    code = ("import sys, partitioner, partitioner.solvers; "
            "print(sorted(m for m in ('torch', 'onnxruntime', 'xgboost', 'stable_baselines3', 'optuna') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"

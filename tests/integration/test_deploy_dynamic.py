"""`flatpack deploy --dim`: a transformer exported with dynamic axes, served at the shapes the dims fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from functions.session import make_session
from serving.api.client import InferError, infer_http

pytest.importorskip("torch")
from tests.dynamic_encoder import encoder_inputs, export_encoder  # noqa: E402 - needs torch


def flatpack(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "serving.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


def test_deploy_a_dynamic_axes_encoder_with_dims(tmp_path: Path) -> None:
    env = {**os.environ, "FLATPACK_STATE_DIR": str(tmp_path / "state"), "FLATPACK_CACHE_DIR": str(tmp_path / "cache")}
    model = export_encoder(tmp_path / "encoder.onnx")
    res = flatpack("deploy", str(model), "--dim", "batch=1", "--dim", "seq=32", "--mode", "lo", "--detach",
                   "--port", "0", "--name", "enc", "--no-calibrate", "--max-group", "2", env=env)
    assert res.returncode == 0, res.stderr + res.stdout
    record = json.loads((tmp_path / "state" / "deployments" / "enc.json").read_text())
    try:
        plan = json.loads((Path(record["bundle"]) / "plan.json").read_text())
        assert plan["model"]["dims"] == {"batch": 1, "seq": 32}
        with urllib.request.urlopen(f"{record['endpoint']}/v2/models/enc", timeout=30) as r:  # noqa: S310 - loopback
            meta = json.loads(r.read())
        assert {i["name"]: i["shape"] for i in meta["inputs"]} == {
            "input_ids": [1, 32], "attention_mask": [1, 32], "token_type_ids": [1, 32]}
        assert meta["outputs"][0]["shape"] == [1, 32, 64]
        x = encoder_inputs(1, 32, seed=3)
        want = make_session(model).run(None, x)[0]  # onnxruntime on the original, dynamic model
        got = infer_http(record["endpoint"], "enc", x)["output"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        with pytest.raises(InferError, match=r"HTTP 400.*the model takes \[1, 32\]"):
            infer_http(record["endpoint"], "enc", encoder_inputs(1, 16))
    finally:
        res = flatpack("undeploy", "enc", env=env)
    assert res.returncode == 0, res.stderr

"""Security across processes: a Redis password honoured end to end and never shown or logged; no pickle.

(Elsewhere: the local platform's token, function environments and bundles in
tests/integration/test_platform_security.py, the bearer token in tests/integration/test_endpoint.py, shm modes
and per-deployment directories and Redis key names in tests/integration/test_transports.py, the IAM policies
in tests/integration/test_target_lambda.py.)
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import urllib.request

import numpy as np
import pytest

from functions.compare import rel_err
from functions.errors import TransportError
from serving.platform.deploy import deploy_bundle
from serving.platform.master_client import MasterClient
from tests.conftest import PROJECT_ROOT

PASSWORD = "pa55-w0rd-xyzzy"  # noqa: S105 - a test password, looked for in every log line


@pytest.fixture(scope="module")
def secured_redis(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("redis")
    if shutil.which("redis-server") is None:
        pytest.skip("needs redis-server on PATH to start a password-protected one")
    from bench.harness.redis_server import OwnRedis

    r = OwnRedis(tmp_path_factory.mktemp("redis"), password=PASSWORD).start()
    yield r
    r.stop()


def test_redis_password_is_honoured_and_never_shown_or_logged(platform, bundles, reference, secured_redis,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    bundle = bundles.conv_channel
    d = deploy_bundle(platform.client, bundle, transport="redis", redis_url=secured_redis.url,
                      shm_dir=platform.config.shm_dir)
    client = MasterClient(d, platform.url, timeout_s=60)
    try:
        x = {"x": np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)}
        got = client.infer(x)
        want = reference(bundle, x)
        assert all(rel_err(got[k], want[k]) <= 1e-4 for k in want)
        assert secured_redis.keys() == 0  # every tensor deleted after use
        # what the platform shows about the function: its env, without the password
        req = urllib.request.Request(f"{platform.url}/flatpack/functions/{d.master}",  # noqa: S310 - loopback
                                     headers={"Authorization": f"Bearer {platform.token}"})
        with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310
            shown = r.read().decode()
        assert PASSWORD not in shown
        assert ":***@127.0.0.1" in json.loads(shown)["env"]["FLATPACK_REDIS_URL"]
        assert PASSWORD not in json.dumps(platform.client.functions())
    finally:
        client.close()
        d.remove()
    # a wrong password: a clear error that names the store, not the password
    bad_url = secured_redis.url.replace(PASSWORD, "not-" + PASSWORD[::-1])
    d = deploy_bundle(platform.client, bundle, transport="redis", redis_url=bad_url,
                      shm_dir=platform.config.shm_dir)
    client = MasterClient(d, platform.url, timeout_s=30)
    try:
        with pytest.raises(TransportError) as info:
            client.infer({"x": np.zeros((1, 3, 8, 8), np.float32)})
        assert PASSWORD[::-1] not in str(info.value) and "127.0.0.1" in str(info.value)
    finally:
        client.close()
        d.remove(purge=False)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert PASSWORD not in logged and PASSWORD[::-1] not in logged


_PICKLE = re.compile(r"^\s*(import|from)\s+(pickle|cPickle|cloudpickle|dill|shelve|marshal)\b|allow_pickle\s*=\s*True"
                     r"|joblib\.load|torch\.load\((?![^)]*weights_only\s*=\s*True)", re.M)


def test_nothing_reads_pickles() -> None:
    """No module of the product deserialises pickles (or marshal, shelve, torch.load without weights_only):
    everything that crosses a process boundary is JSON, the tensor codec, ONNX or npz without pickles."""
    hits = []
    for pkg in ("functions", "serving", "partitioner", "bench", "autoencoder", "templates"):
        for path in (PROJECT_ROOT / pkg).rglob("*.py"):
            text = path.read_text(errors="replace")
            hits += [f"{path.relative_to(PROJECT_ROOT)}: {m.group(0).strip()}" for m in _PICKLE.finditer(text)]
    assert not hits, hits

"""More concurrent requests than a deployment's functions may run at once: queued, or 503 with Retry-After.

A deployment whose functions may run one instance each (a request waits at most 0.5 s for one; a running
one has the default 60 s) gets 10 requests
at once through the real endpoint: each is answered correctly or refused with 503 and a Retry-After
header; nothing crashes, and the deployment answers normally afterwards.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from email.message import Message

import numpy as np

from functions.compare import rel_err
from functions.inference_protocol import HEADER_LENGTH
from serving.api import DataPlane, create_app
from serving.api.server import AppServer
from serving.deploy.local import PlatformBackend
from serving.platform.deploy import deploy_bundle


def _post(url: str, x: np.ndarray) -> tuple[int, Message, bytes]:
    head = json.dumps({"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "parameters": {"binary_data_output": True}}).encode()
    req = urllib.request.Request(url, data=head + x.tobytes(), headers={HEADER_LENGTH: str(len(head))})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:  # noqa: S310 - loopback test server
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def test_over_the_limit_is_queued_or_503_with_retry_after(platform, bundles, reference) -> None:
    bundle = bundles.slower
    d = deploy_bundle(platform.client, bundle, transport="shm", shm_dir=platform.config.shm_dir, concurrency=1,
                      queue_timeout_s=0.5)
    backend = PlatformBackend(d, platform.url, name="slow", timeout_s=30)
    x = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    want = reference(bundle, {"x": x})["y"]
    backend.warm_up({"x": x})
    plane = DataPlane()
    plane.add(backend)
    try:
        with AppServer(create_app(plane, token="")) as s:
            url = f"{s.url}/v2/models/slow/infer"
            with ThreadPoolExecutor(10) as pool:
                answers = list(pool.map(lambda _: _post(url, x), range(10)))
            codes = sorted(code for code, _, _ in answers)
            assert set(codes) <= {200, 503}, codes
            assert 200 in codes and 503 in codes, codes  # some queued and answered, some refused
            for code, headers, body in answers:
                if code == 503:
                    assert int(headers["Retry-After"]) >= 1
                    assert "concurrency limit" in json.loads(body)["error"]
                else:
                    n = int(headers[HEADER_LENGTH])
                    got = np.frombuffer(body[n:], np.float32).reshape(want.shape)
                    assert rel_err(got, want) <= 1e-4
            code, _, _ = _post(url, x)  # and afterwards it simply answers
            assert code == 200
    finally:
        backend.close()
        d.remove()

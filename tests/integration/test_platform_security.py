"""Attacks on the local platform, for real: its token (every route but /healthz), the environment a function
may be given, the bundles it may run, and another OS user on the same machine.

Each test plays the attacker over real HTTP against a real platform (the session's, or one started for the
test) and checks that nothing ran: no marker file written by planted code, no function registered, no
instance started, the meter unchanged.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from functions.compare import rel_err
from functions.invoker.local import TOKEN_HEADER

pytest.importorskip("fastapi", reason="the platform tests need flatpack[server]")

from serving.platform import FunctionSpec, LocalPlatform, PlatformConfig  # noqa: E402
from serving.platform.deploy import Deployment, deploy_bundle  # noqa: E402
from serving.platform.master_client import MasterClient  # noqa: E402

EVIL = "evil"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request(url: str, method: str = "GET", body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})  # noqa: S310 - loopback
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - loopback
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _evil_spec(**env: str) -> bytes:
    return json.dumps({"name": EVIL, "memory_mb": 256, "env": env}).encode()


@pytest.fixture
def pwn(tmp_path: Path) -> Path:
    """A directory with a ``sitecustomize.py`` that, if any Python process ever imports it, writes ``owned``."""
    d = tmp_path / "pwn"
    d.mkdir()
    marker = d / "owned"
    (d / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    return d


def _nothing_ran(pwn: Path) -> None:
    assert sorted(p.name for p in pwn.iterdir()) == ["sitecustomize.py"]


@pytest.fixture
def deployed(platform: LocalPlatform, bundles) -> Iterator[Deployment]:
    d = deploy_bundle(platform.client, bundles.tiny, transport="inline", shm_dir=platform.config.shm_dir)
    yield d
    d.remove()


# -- the sequence, against `flatpack platform start` ----------------------------------------------

def test_the_reported_attack_runs_nothing(tmp_path: Path, pwn: Path) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "FLATPACK_STATE_DIR": str(tmp_path / "state")}
    cli = [sys.executable, "-m", "serving.cli", "platform"]
    started = subprocess.run([*cli, "start", "--port", str(port)], env=env, capture_output=True, text=True,
                             timeout=60)
    assert started.returncode == 0, started.stderr
    try:
        status, body = _request(f"{url}/flatpack/functions/{EVIL}", "PUT", _evil_spec(PYTHONPATH=str(pwn)),
                                {"Content-Type": "application/json"})
        assert status == 401, body
        status, _ = _request(f"{url}/2015-03-31/functions/{EVIL}/invocations", "POST", b"{}")
        assert status == 401
        # the owner, with the token, is told why the same registration is refused
        token_file = tmp_path / "state" / "platforms" / str(port) / "token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
        auth = {TOKEN_HEADER: token_file.read_text().strip()}
        status, body = _request(f"{url}/flatpack/functions/{EVIL}", "PUT", _evil_spec(PYTHONPATH=str(pwn)),
                                {"Content-Type": "application/json", **auth})
        assert status == 400 and "PYTHONPATH" in json.loads(body)["error"]["message"]
        status, _ = _request(f"{url}/2015-03-31/functions/{EVIL}/invocations", "POST", b"{}", auth)
        assert status == 404  # never registered
        status, body = _request(f"{url}/flatpack/functions", headers=auth)
        assert status == 200 and json.loads(body)["functions"] == []
        status, body = _request(f"{url}/flatpack/meter", headers=auth)
        assert json.loads(body)["functions"] == {} and not json.loads(body)["total"].get("cold_starts")
    finally:
        stopped = subprocess.run([*cli, "stop"], env=env, capture_output=True, text=True, timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    _nothing_ran(pwn)
    assert not (tmp_path / "state" / "platforms" / str(port)).exists()  # its token went with it


# -- the environment a function may be given -------------------------------------------------------------

@pytest.mark.parametrize("var", ["PYTHONPATH", "LD_PRELOAD", "PYTHONSTARTUP", "LD_LIBRARY_PATH", "PATH",
                                 "PYTHONHOME", "OMP_NUM_THREADS"])
def test_loader_variables_are_refused_by_name(platform: LocalPlatform, pwn: Path, var: str) -> None:
    status, body = _request(f"{platform.url}/flatpack/functions/{EVIL}", "PUT",
                            _evil_spec(**{var: str(pwn / "x")}), {TOKEN_HEADER: platform.token})
    assert status == 400
    msg = json.loads(body)["error"]["message"]
    assert var in msg and "refused" in msg
    with pytest.raises(ValueError, match="HTTP 404"):
        platform.client.function(EVIL)
    _nothing_ran(pwn)


@pytest.mark.parametrize(("var", "why"), [
    ("SOME_OTHER_SETTING", "not a setting a function reads"),
    ("FLATPACK_BUNDLE_DIR", "set by the platform"),
    ("FLATPACK_INVOKE_TOKEN", "set by the platform"),
    ("FLATPACK_CPU_SHARE", "set by the platform"),
    ("FLATPACK_BUNDLE_S3_URI", "never one fetched from S3"),
])
def test_only_allow_listed_variables_are_taken(platform: LocalPlatform, var: str, why: str) -> None:
    with pytest.raises(ValueError, match=rf"HTTP 400: .*{var}.*{why}"):
        platform.client.register(FunctionSpec(EVIL, memory_mb=256, env={var: "s3://b/p" if "S3" in var else "x"}))
    # what the runtime reads is taken (an empty FLATPACK_BUNDLE_S3_URI is what a deployer always sends)
    platform.client.register(FunctionSpec(EVIL, memory_mb=256, env={"FLATPACK_TRANSPORT": "inline",
                                                                     "FLATPACK_BUNDLE_S3_URI": ""}))
    platform.client.remove(EVIL)


@pytest.mark.parametrize("key", ["python", "argv", "command"])
def test_a_spec_cannot_name_an_interpreter(platform: LocalPlatform, key: str) -> None:
    doc = {"name": EVIL, "memory_mb": 256, key: "/tmp/pwn/python"}  # noqa: S108 - never used as a path
    status, body = _request(f"{platform.url}/flatpack/functions/{EVIL}", "PUT", json.dumps(doc).encode(),
                            {TOKEN_HEADER: platform.token})
    assert status == 400 and key in json.loads(body)["error"]["message"]


def _memory_holds(pid: int, needle: bytes) -> bool:
    """Whether ``needle`` is anywhere in process ``pid``'s readable memory (``/proc/PID/mem``)."""
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("r"):
                continue
            lo, hi = (int(a, 16) for a in span.split("-"))
            try:
                mem.seek(lo)
                if needle in mem.read(hi - lo):
                    return True
            except (OSError, ValueError, OverflowError):  # [vvar] and the like cannot be read
                continue
    return False


def test_instances_get_an_invoke_only_token_and_nothing_planted(platform: LocalPlatform, deployed: Deployment) -> None:
    from tests.integration.test_platform import X, part_event

    worker = deployed.names["worker-1"]
    inv_token = platform.service.credentials.invoke_token
    status, _ = _request(f"{platform.url}/2015-03-31/functions/{worker}/invocations", "POST",
                         part_event(deployed, X).encode(), {TOKEN_HEADER: inv_token})
    assert status == 200
    pid = platform.client.function(worker)["instances"][0]["pid"]
    # its environment as it runs (a forked instance's /proc/PID/environ is the zygote's, from its exec): the
    # invoke-only token and a bundle in the store are there, and the control token is nowhere in its memory
    assert _memory_holds(pid, f"FLATPACK_INVOKE_TOKEN={inv_token}".encode())
    assert _memory_holds(pid, f"FLATPACK_BUNDLE_DIR={platform.token_file.parent / 'bundles'}/".encode())
    assert not _memory_holds(pid, platform.token.encode())
    assert platform.token not in Path(f"/proc/{pid}/environ").read_text()
    # the invoke-only token is refused everywhere else
    for method, path in (("GET", "/flatpack/functions"), ("DELETE", f"/flatpack/functions/{worker}"),
                         ("PUT", f"/flatpack/functions/{EVIL}")):
        status, _ = _request(f"{platform.url}{path}", method, b"{}" if method == "PUT" else None,
                             {TOKEN_HEADER: inv_token})
        assert status == 401, (method, path)
    assert platform.client.function(worker)["name"] == worker


def test_a_master_invokes_its_workers_with_the_invoke_token(platform: LocalPlatform, bundles, reference) -> None:
    d = deploy_bundle(platform.client, bundles.conv_channel, transport="inline", shm_dir=platform.config.shm_dir)
    client = MasterClient(d, platform.url, timeout_s=60)
    try:
        x = {"x": np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)}
        got, want = client.infer(x), reference(bundles.conv_channel, x)
        assert all(rel_err(got[k], want[k]) <= 1e-4 for k in want)
    finally:
        client.close()
        d.remove()


# -- the bundles a function may run -----------------------------------------------------------------------

def _store(platform: LocalPlatform) -> Path:
    return platform.token_file.parent / "bundles"


def test_a_bundle_outside_the_state_directory_is_refused(platform: LocalPlatform, bundles, tmp_path: Path) -> None:
    for where in (str(bundles.tiny), f"{_store(platform)}/../../..", "/"):
        with pytest.raises(ValueError, match="HTTP 400: .*not a bundle this platform took in"):
            platform.client.register(FunctionSpec(EVIL, memory_mb=256, bundle_dir=where))
    # nor a link placed in the store that points out of it
    link = _store(platform) / "elsewhere"
    link.symlink_to(bundles.tiny, target_is_directory=True)
    try:
        with pytest.raises(ValueError, match="HTTP 400: .*not a bundle this platform took in"):
            platform.client.register(FunctionSpec(EVIL, memory_mb=256, bundle_dir=str(link)))
    finally:
        link.unlink()
    with pytest.raises(ValueError, match="HTTP 404"):
        platform.client.function(EVIL)


def test_a_tampered_part_file_is_refused(platform: LocalPlatform, bundles, tmp_path: Path) -> None:
    # changed before the platform took it in
    copy = tmp_path / "tampered"
    shutil.copytree(bundles.tiny, copy)
    part = next(copy.glob("parts/*.onnx"))
    part.write_bytes(part.read_bytes() + b"\0")
    with pytest.raises(ValueError, match="HTTP 400: .*changed since export"):
        platform.client.stage_bundle(copy)
    # changed in the platform's copy after it was checked (only the owner could): refused at registration
    staged = Path(platform.client.stage_bundle(bundles.tiny))
    assert staged.parent == _store(platform)
    inside = staged / part.relative_to(copy)
    inside.write_bytes(inside.read_bytes() + b"\0")
    with pytest.raises(ValueError, match="HTTP 400: .*changed after it was checked"):
        platform.client.register(FunctionSpec(EVIL, memory_mb=256, bundle_dir=str(staged)))
    # taking the bundle in again replaces the altered copy
    assert Path(platform.client.stage_bundle(bundles.tiny)) == staged
    platform.client.register(FunctionSpec(EVIL, memory_mb=256, bundle_dir=str(staged)))
    platform.client.remove(EVIL)


def test_a_manifest_naming_paths_outside_its_bundle_is_refused(platform: LocalPlatform, bundles,
                                                               tmp_path: Path) -> None:
    copy = tmp_path / "escape"
    shutil.copytree(bundles.tiny, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"]["../../../etc/hostname"] = "0" * 64
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="HTTP 400: .*not a path inside the bundle"):
        platform.client.stage_bundle(copy)


# -- every route wants the token --------------------------------------------------------------------------

_ROUTES = [
    ("POST", "/2015-03-31/functions/{f}/invocations"),
    ("POST", "/function/{f}"),
    ("PUT", "/flatpack/functions/{f}"),
    ("DELETE", "/flatpack/functions/{f}"),
    ("GET", "/flatpack/functions"),
    ("GET", "/flatpack/functions/{f}"),
    ("PUT", "/flatpack/bundles"),
    ("GET", "/flatpack/meter"),
    ("GET", "/metrics"),
    ("GET", "/no-such-route"),
    ("GET", "/openapi.json"),
]


def test_every_route_but_healthz_refuses_missing_or_wrong_tokens(platform: LocalPlatform, deployed: Deployment,
                                                                  bundles, caplog: pytest.LogCaptureFixture) -> None:
    from tests.integration.test_platform import X, part_event

    caplog.set_level(logging.DEBUG)
    worker = deployed.names["worker-1"]
    before = platform.client.meter()["total"]
    fn_before = platform.client.function(worker)
    staged_before = sorted(p.name for p in _store(platform).iterdir())
    bodies = {"POST": part_event(deployed, X).encode(),
              "PUT": json.dumps({"name": worker, "memory_mb": 2048, "source": str(bundles.chain)}).encode()}
    wrong = platform.token[:-1] + ("A" if platform.token[-1] != "A" else "B")
    credentials: list[dict[str, str]] = [
        {}, {TOKEN_HEADER: wrong}, {"Authorization": f"Bearer {wrong}"}, {TOKEN_HEADER: ""},
        {"Authorization": f"Basic {platform.token}"}, {"Authorization": platform.token},
        {TOKEN_HEADER: platform.token[:-1]},
    ]
    for method, path in _ROUTES:
        url = platform.url + path.format(f=worker)
        for headers in credentials:
            status, body = _request(url, method, bodies.get(method), headers)
            assert status == 401, (method, path, headers)
            doc = json.loads(body)
            assert "token" in (doc.get("message") or doc["error"]["message"])
            assert wrong not in body.decode()
    # nothing was done: the function is there as it was, nothing ran, nothing was taken in
    fn = platform.client.function(worker)
    assert fn["memory_mb"] == fn_before["memory_mb"] != 2048 and fn["instances"] == fn_before["instances"] == []
    assert platform.client.meter()["total"] == before
    assert sorted(p.name for p in _store(platform).iterdir()) == staged_before
    # and nothing was logged but the refusals, none with what was presented
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("serving.platform")]
    assert sum(m.startswith("refused ") for m in ours) == len(_ROUTES) * len(credentials)
    assert not [m for m in ours if m.startswith(("registered", "started"))]
    assert not [m for m in ours if wrong in m or platform.token in m]
    # /healthz is open; with the token (either header) every route answers
    assert _request(f"{platform.url}/healthz")[0] == 200
    for headers in ({TOKEN_HEADER: platform.token}, {"Authorization": f"Bearer {platform.token}"}):
        assert _request(f"{platform.url}/flatpack/functions/{worker}", headers=headers)[0] == 200


def test_boto3_needs_the_token_too(platform: LocalPlatform, deployed: Deployment, aws_env) -> None:
    boto3 = pytest.importorskip("boto3")
    from botocore.exceptions import ClientError

    from serving.platform.client import authorize_boto3
    from tests.integration.test_platform import X, part_event

    name = deployed.names["worker-1"]
    raw = boto3.client("lambda", endpoint_url=platform.url, region_name="us-east-1")
    with pytest.raises(ClientError) as info:
        raw.invoke(FunctionName=name, Payload=part_event(deployed, X).encode("json"))
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 401
    assert info.value.response["Error"]["Code"] == "UnrecognizedClientException"
    authorize_boto3(raw, platform.token)
    resp = raw.invoke(FunctionName=name, Payload=part_event(deployed, X).encode("json"))
    assert resp["StatusCode"] == 200 and "FunctionError" not in resp


# -- another OS user --------------------------------------------------------------------------------------

def _as_nobody(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd],  # noqa: S607
                          capture_output=True, text=True, timeout=30)


def test_another_user_can_neither_read_the_token_nor_get_in(shm_root: Path, pwn: Path) -> None:
    if os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("curl"):
        pytest.skip("needs root (to become another user), setpriv and curl")
    real_tmp = os.environ.get("FLATPACK_TEST_REAL_TMPDIR") or "/tmp"  # noqa: S108 - a place the other user can reach
    # a state directory every user can look into, as a careless setup might leave it
    state = Path(tempfile.mkdtemp(prefix="flatpack-tests-other-user-", dir=real_tmp))
    try:
        state.chmod(0o755)
        pwn_shared = state / "pwn"
        shutil.copytree(pwn, pwn_shared)
        pwn_shared.chmod(0o777)
        if _as_nobody("true").returncode != 0:
            pytest.skip("cannot run a command as nobody here")
        with LocalPlatform(PlatformConfig(port=0, shm_dir=shm_root, cpu_limit="off", state_dir=state)) as p:
            assert _as_nobody("cat", str(p.token_file)).returncode != 0
            assert _as_nobody("ls", str(p.token_file.parent)).returncode != 0
            for method, path, body in (
                ("PUT", f"/flatpack/functions/{EVIL}", _evil_spec(PYTHONPATH=str(pwn_shared)).decode()),
                ("POST", f"/2015-03-31/functions/{EVIL}/invocations", "{}"),
                ("GET", "/flatpack/functions", ""),
            ):
                out = _as_nobody("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", method,
                                 "-H", "Content-Type: application/json", *(("-d", body) if body else ()),
                                 p.url + path)
                assert out.stdout == "401", (method, path, out.stdout, out.stderr)
            assert p.client.functions() == []
        _nothing_ran(pwn_shared)
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_every_kind_of_lambda_invocation_is_answered_past_the_fast_path(platform: LocalPlatform,
                                                                        deployed: Deployment) -> None:
    """RequestResponse invocations take the platform's fast path (plain ASGI, the token checked there); the
    other kinds still reach the routes. With the invoke token each is answered in Lambda's shape; an unknown
    function is Lambda's 404 either way."""
    from tests.integration.test_platform import X, part_event

    worker = deployed.names["worker-1"]
    url = f"{platform.url}/2015-03-31/functions/{worker}/invocations"
    body = part_event(deployed, X).encode()
    auth = {TOKEN_HEADER: platform.token}
    before = platform.client.meter()["functions"].get(worker, {}).get("invocations", 0)
    status, reply = _request(url, "POST", body, auth)
    assert status == 200 and reply
    assert _request(url, "POST", body, {**auth, "X-Amz-Invocation-Type": "DryRun"})[0] == 204
    assert _request(url, "POST", body, {**auth, "X-Amz-Invocation-Type": "Event"})[0] == 202
    deadline = time.monotonic() + 60
    while platform.client.meter()["functions"].get(worker, {}).get("invocations", 0) < before + 2:
        assert time.monotonic() < deadline, "the Event invocation never ran"
        time.sleep(0.05)
    status, reply = _request(url.replace(worker, "no-such-function"), "POST", body, auth)
    assert status == 404 and b"Function not found: no-such-function" in reply

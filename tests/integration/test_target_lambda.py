"""The AWS Lambda target, offline with the tools its users use: the rendered service packaged by the
Serverless Framework v3 (error validation) and linted by cfn-lint, run end to end under serverless-offline
(the master fanning out to workers with boto3 through its Lambda port), the vendored package run without
site-packages, and the boto3 deployer against moto's server.

Node tools: ``build/tools/node_modules`` (serverless@3 and serverless-offline@13, ``npm ci`` from the lockfile
in ``tests/integration/node``; installed here when npm exists and they are missing). Tests needing them skip
only where Node is absent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from functions.plan import Plan
from serving.deploy.lambda_service import LambdaOptions, LambdaService, render_lambda_service
from tests.conftest import free_port, reference_outputs
from tests.integration.serverless import SLS_ENV, TOOLS, serverless_cli, serverless_offline


def _policy_statements(doc: dict, role_id: str) -> list[dict]:
    return doc["resources"]["Resources"][role_id]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]


def _join(v: object) -> str:
    """A Fn::Join ARN rendered with the pseudo parameters' names, for reading in assertions."""
    if isinstance(v, str):
        return v
    assert isinstance(v, dict) and list(v) == ["Fn::Join"], v
    return "".join(p if isinstance(p, str) else f"<{p['Ref']}>" for p in v["Fn::Join"][1])


@pytest.fixture(scope="module")
def sls() -> Path:
    return serverless_cli()


@pytest.fixture(scope="module")
def conv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import conv_channel_bundle

    return conv_channel_bundle(tmp_path_factory.mktemp("lambda") / "conv")


# --------------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------------


def test_render_one_function_per_plan_function(conv: Path, tmp_path: Path) -> None:
    svc = render_lambda_service(conv, tmp_path / "svc", deployment="cc", options=LambdaOptions(vendor=False))
    plan = Plan.load(conv / "plan.json")
    doc = yaml.safe_load((tmp_path / "svc" / "flatpack.yml").read_text())
    top = yaml.safe_load((tmp_path / "svc" / "serverless.yml").read_text())
    assert top["frameworkVersion"] == "3" and top["configValidationMode"] == "error"
    fns = {f["name"]: f for f in doc["functions"].values()}
    assert sorted(fns) == sorted(f"cc-{f.name}" for f in plan.functions)
    for f in plan.functions:
        spec = fns[f"cc-{f.name}"]
        assert spec["memorySize"] == f.memory_mb and spec["timeout"] == 29
        assert spec["environment"]["FLATPACK_FUNCTION"] == f.name
        assert spec["handler"] == "${self:custom.flatpack.prefix}flatpack_entry.handler"
        # each package carries only the parts its function runs
        own = {p.file for s in plan.stages for p in s.parts if p.function == f.name}
        assert {p.split("bundle/", 1)[1] for p in spec.get("package", {}).get("patterns", [])} == own
    master = fns["cc-master"]
    routes = {(e["httpApi"]["method"], e["httpApi"]["path"]) for e in master["events"]}
    # every model name reaches the handler, which answers an unknown one itself (404, as the local endpoint)
    assert ("POST", "/v2/models/{name}/infer") in routes and ("GET", "/v2/health/ready") in routes
    assert master["role"] == "FlatpackMasterRole" and fns["cc-worker-1"]["role"] == "FlatpackWorkerRole"
    env = doc["provider"]["environment"]
    assert env["FLATPACK_INVOKER"] == "lambda" and env["FLATPACK_FUNCTION_PREFIX"] == "cc-"
    assert env["FLATPACK_MODEL_NAME"] == "cc" and env["FLATPACK_INVOKE_QUALIFIER"] == "live"
    # each function is published as a version (named by a digest of what it runs) with the alias `live`,
    # which the master invokes its workers at and the HTTP API invokes the master at
    res = doc["resources"]["Resources"]
    assert doc["provider"]["versionFunctions"] is False
    for key in ("Master", "Worker1", "Worker2"):
        (version,) = [k for k in res if k.startswith(f"{key}FlatpackVersion")]
        assert res[version]["Properties"]["FunctionName"] == {"Ref": f"{key}LambdaFunction"}
        assert res[f"{key}LiveAlias"]["Properties"] == {"FunctionName": {"Ref": f"{key}LambdaFunction"},
                                                       "Name": "live",
                                                       "FunctionVersion": {"Fn::GetAtt": [version, "Version"]}}
    assert doc["resources"]["extensions"]["HttpApiIntegrationMaster"]["Properties"] == {
        "IntegrationUri": {"Ref": "MasterLiveAlias"}}
    assert env["FLATPACK_FALLBACK_TRANSPORT"] == "s3" and env["FLATPACK_S3_BUCKET"] == {"Ref": "FlatpackBucket"}
    assert doc["provider"]["runtime"] == "python3.11"
    assert svc.parts_in_s3 == {"cc-master": False, "cc-worker-1": False, "cc-worker-2": False}
    assert LambdaService.load(tmp_path / "svc").functions == svc.functions
    assert (tmp_path / "svc" / "functions" / "runtime.py").is_file()
    assert not (tmp_path / "svc" / "bundle" / "source.onnx").exists()


def _over_limit(conv: Path, tmp_path: Path) -> int:
    """A package limit the workers' parts do not fit under (the master, with none, does)."""
    svc = render_lambda_service(conv, tmp_path / "probe", deployment="cc", options=LambdaOptions(vendor=False))
    return svc.package_bytes["cc-master"] + 1


def test_iam_grants_nothing_beyond_the_deployment(conv: Path, tmp_path: Path) -> None:
    render_lambda_service(conv, tmp_path / "svc", deployment="cc",
                          options=LambdaOptions(vendor=False, unzipped_limit_bytes=_over_limit(conv, tmp_path)))
    text = (tmp_path / "svc" / "flatpack.yml").read_text()
    assert "${aws:accountId}" not in text  # resolving it needs the network; Ref: AWS::AccountId does not
    doc = yaml.safe_load(text)
    allowed = {"logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "lambda:InvokeFunction",
               "s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket"}
    for role_id in ("FlatpackMasterRole", "FlatpackWorkerRole"):
        for st in _policy_statements(doc, role_id):
            actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            assert set(actions) <= allowed and st["Effect"] == "Allow"
            resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
            for r in map(_join, resources):
                assert r.startswith("arn:<AWS::Partition>:")
                if st["Sid"] == "ListOwnPrefixes":
                    assert r.endswith(":::<FlatpackBucket>")
                    assert all(p.startswith(("flatpack/cc/", "bundles/cc/"))
                               for p in st["Condition"]["StringLike"]["s3:prefix"])
                elif r.startswith("arn:<AWS::Partition>:s3"):
                    own = ("<FlatpackBucket>/flatpack/cc/", "<FlatpackBucket>/bundles/cc/")
                    assert r.split(":::", 1)[1].startswith(own)
                else:
                    assert "<AWS::Region>:<AWS::AccountId>:" in r and ("/aws/lambda/cc-" in r or "function:cc-" in r)
    master = {st["Sid"]: st for st in _policy_statements(doc, "FlatpackMasterRole")}
    invoked = {_join(r).split("function:", 1)[1] for r in master["InvokeOwnWorkers"]["Resource"]}
    assert invoked == {"cc-worker-1", "cc-worker-1:*", "cc-worker-2", "cc-worker-2:*"}
    workers = {st["Sid"] for st in _policy_statements(doc, "FlatpackWorkerRole")}
    assert "InvokeOwnWorkers" not in workers
    # the workers' parts were over the package limit: they come from the bucket, read-only
    assert "ReadOwnBundle" in workers and "ReadOwnBundle" not in master
    worker_st = {st["Sid"]: st for st in _policy_statements(doc, "FlatpackWorkerRole")}
    assert worker_st["ReadOwnBundle"]["Action"] == "s3:GetObject"
    w1 = next(f for f in doc["functions"].values() if f["name"] == "cc-worker-1")
    assert "package" not in w1 and "FLATPACK_BUNDLE_S3_URI" in w1["environment"]


def test_options_refuse_what_lambda_cannot_do() -> None:
    with pytest.raises(ValueError, match="one host"):
        LambdaOptions(transport="shm")
    with pytest.raises(ValueError, match="redis-url"):
        LambdaOptions(transport="redis")
    with pytest.raises(ValueError, match="30 s"):
        LambdaOptions(timeout_s=60)


# --------------------------------------------------------------------------------------------------
# The Serverless Framework and cfn-lint
# --------------------------------------------------------------------------------------------------


def _sls(sls: Path, cwd: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([str(sls), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, **SLS_ENV})


def test_serverless_package_and_cfn_lint(sls: Path, conv: Path, tmp_path: Path) -> None:
    pytest.importorskip("cfnlint", reason="cfn-lint is in the dev extra: pip install 'flatpack[dev]'")
    out = tmp_path / "svc"
    # the workers' parts over the package limit: the bucket, the upload plugin and the S3 bundle are in too
    render_lambda_service(conv, out, deployment="cc",
                          options=LambdaOptions(vendor=False, unzipped_limit_bytes=_over_limit(conv, tmp_path)))
    res = _sls(sls, out, "package", "--region", "us-east-1")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    template = out / ".serverless" / "cloudformation-template-update-stack.json"
    cfn = json.loads(template.read_text())["Resources"]
    # the HTTP API calls the master's alias, which points at the version this deploy publishes
    assert cfn["HttpApiIntegrationMaster"]["Properties"]["IntegrationUri"] == {"Ref": "MasterLiveAlias"}
    assert cfn["MasterLambdaPermissionHttpApi"]["Properties"]["FunctionName"] == {"Ref": "MasterLiveAlias"}
    assert not any(r["Type"] == "AWS::Lambda::Version" and "FlatpackVersion" not in k for k, r in cfn.items())
    assert sum(r["Type"] == "AWS::Lambda::Alias" for r in cfn.values()) == 3
    lambdas = {r["Properties"]["FunctionName"]: r["Properties"] for r in cfn.values()
               if r["Type"] == "AWS::Lambda::Function"}
    assert sorted(lambdas) == ["cc-master", "cc-worker-1", "cc-worker-2"]
    assert {p["MemorySize"] for p in lambdas.values()} == {512}
    assert not any(r["Type"] == "AWS::IAM::Role" and k == "IamRoleLambdaExecution" for k, r in cfn.items())
    for zipname in ("master.zip", "worker1.zip", "worker2.zip"):
        assert (out / ".serverless" / zipname).is_file()
    # cfn-lint reads .cfnlintrc (the template path, and the one rule ignored, with its reason)
    lint = subprocess.run([str(Path(sys.executable).parent / "cfn-lint")], cwd=out, capture_output=True, text=True,
                          timeout=300, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_vendored_package_runs_without_site_packages(conv: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy + onnxruntime as manylinux wheels for python3.11 (Amazon Linux 2), run by this machine's Python
    with no site-packages: the package is what Lambda would import (boto3 comes from the runtime)."""
    from serving.deploy.vendor import VendorError

    monkeypatch.setenv("FLATPACK_CACHE_DIR", str(tmp_path / "cache"))
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the python3.11 wheels can only be imported by Python 3.11")
    try:
        svc = render_lambda_service(conv, tmp_path / "svc", deployment="cc",
                                    options=LambdaOptions(strict_vendor=True))
    except VendorError as e:
        pytest.skip(f"no manylinux wheels to be had here: {e}")
    assert max(svc.package_bytes.values()) < 250 * 2**20
    env = {**dict(svc.master.env), "FLATPACK_S3_BUCKET": "unused", "FLATPACK_AWS_REGION": "us-east-1",
           "FLATPACK_MODEL_NAME": "cc"}
    x = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)
    import boto3

    script = (
        "import json, sys\n"
        "sys.path.insert(0, sys.argv[1]); sys.path.append(sys.argv[2])\n"
        "import flatpack_entry, numpy, onnxruntime\n"
        "rt = flatpack_entry.runtime()\n"
        "from functions.worker import Worker\n"
        "w = Worker(rt.plan, rt.config.bundle_dir, 'worker-1', rt.sessions)\n"
        "x = numpy.asarray(json.loads(sys.argv[3]), numpy.float32).reshape(1, 3, 8, 8)\n"
        "y = rt.sessions.run(rt.config.bundle_dir / 'parts/s00_p00.onnx', {'x': x})['y']\n"
        "print(json.dumps({'numpy': numpy.__file__, 'ort': onnxruntime.__version__, 'y': y.ravel().tolist()}))\n"
    )
    res = subprocess.run([sys.executable, "-S", "-I", "-c", script, str(svc.root),
                          str(Path(boto3.__file__).parent.parent), json.dumps(x.ravel().tolist())],
                         capture_output=True, text=True, timeout=120, check=False,
                         env={"PATH": os.environ.get("PATH", ""), **env}, cwd=svc.root)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["numpy"].startswith(str(svc.root / "vendor")) and out["ort"].startswith("1.16")
    want = reference_outputs(conv, {"x": x})["y"][:, :4]
    assert np.abs(np.asarray(out["y"], np.float32).reshape(want.shape) - want).max() <= 1e-4


# --------------------------------------------------------------------------------------------------
# End to end under serverless-offline
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def offline(sls: Path, conv: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """serverless-offline serving the rendered service: HTTP on one loopback port, Lambda on another."""

    def render(lambda_url: str) -> Path:
        # no S3 fallback: the tensors are small, and serverless-offline has no S3 (nor CloudFormation refs)
        return render_lambda_service(conv, tmp_path / "svc", deployment="cc", options=LambdaOptions(
            vendor=False, plugins=("serverless-offline",), endpoint_url=lambda_url, fallback_transport=None)).root

    with serverless_offline(sls, render, tmp_path / "offline.log", ["cc-master", "cc-worker-1", "cc-worker-2"]) as url:
        yield url, tmp_path / "offline.log"




def _post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def test_offline_end_to_end(offline: tuple[str, Path], conv: Path) -> None:
    url, log = offline
    x = np.random.default_rng(7).standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = reference_outputs(conv, {"x": x})["y"]
    body = {"id": "r1", "inputs": [{"name": "x", "shape": [1, 3, 8, 8], "datatype": "FP32",
                                    "data": x.ravel().tolist()}]}
    status, _, data = _post(f"{url}/v2/models/cc/infer", json.dumps(body).encode())
    assert status == 200, data[:2000].decode(errors="replace") + log.read_text()[-3000:]
    doc = json.loads(data)
    assert doc["id"] == "r1" and doc["model_name"] == "cc"
    out = doc["outputs"][0]
    got = np.asarray(out["data"], np.float32).reshape(out["shape"])
    assert out["name"] == "y" and np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))
    # both workers ran, invoked by the master through serverless-offline's Lambda port
    text = log.read_text()
    assert "(λ: worker1)" in text and "(λ: worker2)" in text
    # the binary tensor extension, both ways
    header = json.dumps({"inputs": [{"name": "x", "shape": [1, 3, 8, 8], "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    status, headers, data = _post(f"{url}/v2/models/cc/infer", header + x.tobytes(),
                                  {"Inference-Header-Content-Length": str(len(header)),
                                   "Content-Type": "application/octet-stream"})
    assert status == 200, data[:2000]
    n = int(headers["inference-header-content-length"])
    got = np.frombuffer(data[n:], np.float32).reshape(json.loads(data[:n])["outputs"][0]["shape"])
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))
    # a client's mistake is a 400 naming it, and the service keeps serving
    bad = {"inputs": [{"name": "x", "shape": [1, 3, 4, 4], "datatype": "FP32", "data": [0.0] * 48}]}
    status, _, data = _post(f"{url}/v2/models/cc/infer", json.dumps(bad).encode())
    assert status == 400 and json.loads(data) == {
        "error": "input 'x' has shape [1, 3, 4, 4], the model takes [1, 3, 8, 8]"}  # the local endpoint's words
    with urllib.request.urlopen(f"{url}/v2/models/cc", timeout=60) as r:
        meta = json.loads(r.read())
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [1, 3, 8, 8]}]


# --------------------------------------------------------------------------------------------------
# The boto3 deployer against moto
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def moto_url(aws_env: None) -> Iterator[str]:
    pytest.importorskip("moto.server", reason="the deployer tests need moto[server] (pip install 'flatpack[dev]')")
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def _inventory(url: str) -> dict[str, set[str]]:
    import boto3

    kw = {"endpoint_url": url, "region_name": "us-east-1"}
    iam, lam, s3 = boto3.client("iam", **kw), boto3.client("lambda", **kw), boto3.client("s3", **kw)
    roles = {r["RoleName"] for r in iam.list_roles()["Roles"]}
    return {
        "roles": roles,
        "policies": {f"{r}/{p}" for r in roles for p in iam.list_role_policies(RoleName=r)["PolicyNames"]},
        "functions": {f["FunctionName"] for f in lam.list_functions()["Functions"]},
        "buckets": {b["Name"] for b in s3.list_buckets().get("Buckets", [])},
    }


def test_boto3_deployer_creates_and_removes_exactly(moto_url: str, conv: Path, tmp_path: Path) -> None:
    import boto3

    from serving.deploy.aws_lambda import ALIAS, LambdaDeployer

    boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1").create_bucket(Bucket="someone-elses")
    before = _inventory(moto_url)
    svc = render_lambda_service(conv, tmp_path / "svc", deployment="cc",
                                options=LambdaOptions(vendor=False, unzipped_limit_bytes=_over_limit(conv, tmp_path)))
    deployer = LambdaDeployer(endpoint_url=moto_url)
    dep = deployer.deploy(svc)
    after = _inventory(moto_url)
    bucket = "flatpack-cc-123456789012"
    assert after["roles"] - before["roles"] == {"flatpack-cc-master", "flatpack-cc-worker"}
    assert after["policies"] - before["policies"] == {"flatpack-cc-master/flatpack", "flatpack-cc-worker/flatpack"}
    assert after["functions"] - before["functions"] == {"cc-master", "cc-worker-1", "cc-worker-2"}
    assert after["buckets"] - before["buckets"] == {bucket}
    kw = {"endpoint_url": moto_url, "region_name": "us-east-1"}
    lam, s3, iam = boto3.client("lambda", **kw), boto3.client("s3", **kw), boto3.client("iam", **kw)
    cfg = lam.get_function_configuration(FunctionName="cc-worker-1")
    assert cfg["MemorySize"] == 512 and cfg["Handler"] == "flatpack_entry.handler" and cfg["Runtime"] == "python3.11"
    # the bundle files under the deployment's prefix and the bundle's digest (a redeploy never overwrites them)
    where = svc.s3_bundle_prefix
    assert where.startswith("bundles/cc/") and len(where) == len("bundles/cc/") + 12
    assert cfg["Environment"]["Variables"]["FLATPACK_BUNDLE_S3_URI"] == f"s3://{bucket}/{where}"
    assert lam.get_alias(FunctionName="cc-master", Name=ALIAS)["FunctionVersion"] == dep.versions["master"]
    assert dep.endpoint and dep.endpoint.startswith("https://")
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert keys == {f"{where}/plan.json", f"{where}/manifest.json", f"{where}/parts/s00_p00.onnx",
                    f"{where}/parts/s00_p01.onnx"}
    master_env = lam.get_function_configuration(FunctionName="cc-master")["Environment"]["Variables"]
    assert "FLATPACK_BUNDLE_S3_URI" not in master_env
    # the master invokes its workers at their published alias, which its policy allows
    from functions.config import FunctionConfig

    cfg_master = FunctionConfig.from_env({**master_env, "FLATPACK_BUNDLE_DIR": "b"})
    assert cfg_master.invoke_name("worker-1") == f"cc-worker-1:{ALIAS}"
    policy = iam.get_role_policy(RoleName="flatpack-cc-master", PolicyName="flatpack")["PolicyDocument"]
    for st in policy["Statement"]:
        for r in st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]:
            assert r.startswith(("arn:aws:logs:us-east-1:123456789012:log-group:/aws/lambda/cc-master",
                                 "arn:aws:lambda:us-east-1:123456789012:function:cc-worker-",
                                 f"arn:aws:s3:::{bucket}")), r
            assert r == f"arn:aws:s3:::{bucket}" or "cc" in r.split(":::")[-1]
    # tensors a request left behind (the TTL backstop's job) go too; the other bucket is untouched
    s3.put_object(Bucket=bucket, Key="flatpack/cc/q1/out.o0", Body=b"x")
    removed = deployer.undeploy(dep)
    assert "bucket " + bucket in removed
    assert _inventory(moto_url) == before
    assert deployer.undeploy(dep) == []  # idempotent


def test_cli_lambda_dry_run_then_deploy_undeploy(moto_url: str, tmp_path: Path) -> None:
    import onnx

    from tests.onnx_builders import mlp

    onnx.save(mlp(), str(tmp_path / "mlp.onnx"))
    env = {**os.environ, "FLATPACK_STATE_DIR": str(tmp_path / "state"), "FLATPACK_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("FLATPACK_S3_BUCKET", None)

    def flatpack(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "serving.cli", *args], capture_output=True, text=True, env=env,
                              timeout=300, check=False)

    res = flatpack("deploy", str(tmp_path / "mlp.onnx"), "--mode", "lo", "--target", "lambda", "--dry-run",
                   "--no-vendor", "-o", str(tmp_path / "out"), "--name", "m")
    assert res.returncode == 0, res.stderr + res.stdout
    assert (tmp_path / "out" / "serverless.yml").is_file() and (tmp_path / "out" / ".cfnlintrc").is_file()
    assert not (tmp_path / "state" / "deployments" / "m.json").exists()
    before = _inventory(moto_url)
    res = flatpack("deploy", str(tmp_path / "mlp.onnx"), "--mode", "lo", "--target", "lambda", "--no-vendor",
                   "--endpoint-url", moto_url, "--name", "m")
    assert res.returncode == 0, res.stderr + res.stdout
    assert "/v2/models/m/infer" in res.stdout
    record = json.loads((tmp_path / "state" / "deployments" / "m.json").read_text())
    assert record["target"] == "lambda" and record["options"]["cloud"]["functions"]
    assert "m-master" in _inventory(moto_url)["functions"]
    res = flatpack("undeploy", "m")
    assert res.returncode == 0, res.stderr + res.stdout
    assert _inventory(moto_url) == before
    assert not (tmp_path / "state" / "deployments" / "m.json").exists()


def test_handler_answers_an_init_failure_with_a_structured_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A function that cannot start (here: no bundle setting) answers each invocation with an InitError the
    master does not retry, instead of raising out of the handler; it tries again on the next invocation."""
    import functions.handlers.aws_lambda as h
    from functions.errors import InitError, error_from_json
    from functions.handlers.instance import Instance

    monkeypatch.setattr(h, "_instance", Instance())
    monkeypatch.delenv("FLATPACK_BUNDLE_DIR", raising=False)
    monkeypatch.setenv("FLATPACK_FUNCTION", "master")
    for _ in range(2):
        doc = h.handler({"kind": "infer"}, None)
        err = error_from_json(doc["error"])
        assert isinstance(err, InitError) and not err.retryable
        assert "FLATPACK_BUNDLE_DIR" in str(err) and err.function == "master"
    assert h._instance.loaded is None


_PLUGIN_HARNESS = """
// Runs the rendered service's upload plugin as `serverless deploy` / `remove` would, its AWS requests sent by
// the AWS SDK the framework itself uses (provider.request is that SDK's service[method](params).promise()),
// pointed at moto's server.
const [, , awsSdk, plugin, endpoint, stack, ...hooks] = process.argv;
const AWS = require(awsSdk);
const Plugin = require(plugin);
const provider = {
  naming: { getStackName: () => stack },
  request: (service, method, params) => new AWS[service]({
    endpoint, region: 'us-east-1', s3ForcePathStyle: true, accessKeyId: 'test', secretAccessKey: 'test',
  })[method](params).promise(),
};
const serverless = { getProvider: () => provider };
const log = { notice: (m) => console.log(m), warning: (m) => console.log(m) };
(async () => {
  const p = new Plugin(serverless, {}, { log });
  for (const hook of hooks) await p.hooks[hook]();
})().catch((e) => { console.error(e); process.exit(1); });
"""


def _run_plugin(sls: Path, svc: Path, moto_url: str, stack: str, *hooks: str) -> str:
    harness = svc.parent / "harness.js"
    harness.write_text(_PLUGIN_HARNESS)
    res = subprocess.run(["node", str(harness), str(TOOLS / "node_modules" / "aws-sdk"),
                          str(svc / "flatpack_bundle_upload.js"), moto_url, stack, *hooks],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_serverless_path_uploads_parts_too_big_for_the_package(sls: Path, moto_url: str, conv: Path,
                                                               tmp_path: Path, reference) -> None:
    """The Serverless Framework path puts the parts that do not fit a package where the boto3 path does
    (same keys, same files), during `serverless deploy`, and a worker cold-starts from them."""
    import boto3

    from functions.bundle import sha256_file
    from functions.codec import decode, encode
    from functions.event import Event, Reply, TensorEntry, now_ms
    from functions.handlers.cold_start import start_runtime

    svc = render_lambda_service(conv, tmp_path / "svc", deployment="cc",
                                options=LambdaOptions(vendor=False, unzipped_limit_bytes=_over_limit(conv, tmp_path)))
    assert (svc.root / "flatpack_bundle_upload.js").is_file() and svc.s3_bundle_files
    doc = yaml.safe_load((svc.root / "flatpack.yml").read_text())
    assert doc["plugins"] == ["./${self:custom.flatpack.prefix}flatpack_bundle_upload"]
    # the stack's bucket as the rendered template declares it, created by (moto's) CloudFormation
    res = doc["resources"]
    template = {"Resources": {"FlatpackBucket": res["Resources"]["FlatpackBucket"]},
                "Outputs": {"FlatpackBucketName": res["Outputs"]["FlatpackBucketName"]}}
    kw = {"endpoint_url": moto_url, "region_name": "us-east-1"}
    cfn, s3 = boto3.client("cloudformation", **kw), boto3.client("s3", **kw)
    # a first deploy: before the update there is no stack output yet, after it the bucket is there
    first = _run_plugin(sls, svc.root, moto_url, "flatpack-cc-dev", "before:aws:deploy:deploy:updateStack")
    assert "uploaded" not in first
    cfn.create_stack(StackName="flatpack-cc-dev", TemplateBody=json.dumps(template))
    outputs = cfn.describe_stacks(StackName="flatpack-cc-dev")["Stacks"][0]["Outputs"]
    bucket = next(o["OutputValue"] for o in outputs if o["OutputKey"] == "FlatpackBucketName")
    out = _run_plugin(sls, svc.root, moto_url, "flatpack-cc-dev", "after:aws:deploy:deploy:updateStack")
    assert "4 of 4 bundle files uploaded" in out
    where = svc.s3_bundle_prefix
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])}
    assert keys == {f"{where}/{rel}" for rel in svc.s3_bundle_files} == {
        f"{where}/plan.json", f"{where}/manifest.json", f"{where}/parts/s00_p00.onnx", f"{where}/parts/s00_p01.onnx"}
    for rel in svc.s3_bundle_files:
        head = s3.head_object(Bucket=bucket, Key=f"{where}/{rel}")
        assert head["Metadata"]["sha256"] == sha256_file(svc.bundle_dir / rel)
    # a deploy with nothing changed sends nothing again
    assert "0 of 4 bundle files uploaded" in _run_plugin(sls, svc.root, moto_url, "flatpack-cc-dev",
                                                         "before:aws:deploy:deploy:updateStack")
    # the worker, its package without parts, starts from the bucket (its rendered environment, the
    # CloudFormation values filled in) and runs its part
    w1 = doc["functions"]["worker1"]["environment"]
    assert w1["FLATPACK_BUNDLE_S3_URI"] == {"Fn::Join": ["", ["s3://", {"Ref": "FlatpackBucket"}, f"/{where}"]]}
    env = {k: v for k, v in doc["provider"]["environment"].items() if isinstance(v, str)}
    env.update({k: v for k, v in w1.items() if isinstance(v, str)})
    env.update({"FLATPACK_S3_BUCKET": bucket, "FLATPACK_AWS_REGION": "us-east-1", "FLATPACK_S3_ENDPOINT_URL": moto_url,
                "FLATPACK_BUNDLE_S3_URI": f"s3://{bucket}/{where}", "FLATPACK_DEPLOYMENT": "cc-s3-test",
                # this test process is no function instance: its memory is not the function's to check
                "FLATPACK_MEMORY_MB": ""})
    rt = start_runtime(env)
    try:
        assert rt.config.bundle_dir != svc.bundle_dir and (rt.config.bundle_dir / "parts" / "s00_p00.onnx").is_file()
        x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)
        ev = Event("part", "r1", "cc-s3-test", now_ms() + 30_000, (TensorEntry("x", data=encode(x)),), stage=0, part=0)
        reply = Reply.from_doc(rt.handle_doc(ev.to_json_doc()))
        assert reply.error is None, reply.error
        want = reference(conv, {"x": x})["y"][:, :4]
        assert np.abs(decode(reply.outputs[0].data) - want).max() <= 1e-5  # type: ignore[arg-type]
    finally:
        rt.close()
    # `serverless remove` empties the deployment's prefixes, so the stack can delete its bucket
    s3.put_object(Bucket=bucket, Key="flatpack/cc/q1/out.o0", Body=b"x")
    _run_plugin(sls, svc.root, moto_url, "flatpack-cc-dev", "before:remove:remove")
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0


# --------------------------------------------------------------------------------------------------
# A plan swapped in, blue/green, behind the same endpoint: moto's control plane, serverless-offline running
# each version of each function
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def emulator(aws_env: None, sls: Path, tmp_path: Path) -> Iterator[object]:
    pytest.importorskip("moto.server", reason="the Lambda emulator needs moto[server] (pip install 'flatpack[dev]')")
    from tests.integration.lambda_emulator import LambdaEmulator

    with LambdaEmulator(sls, tmp_path / "offline") as emu:
        yield emu


def test_a_swapped_plan_serves_behind_the_same_alias_without_a_failed_request(emulator: object, conv: Path,
                                                                               tmp_path: Path) -> None:
    """The deployment's plan (master + two workers) is swapped for another (master + one worker at 1024 MB) while
    a client keeps calling the master's ``live`` alias: every answer is right, the alias moves to the new
    master version, the old workers and their role are gone, the master's role may invoke only the new worker,
    and undeploying the result leaves nothing."""
    import threading

    import boto3

    from serving.deploy.aws_lambda import ALIAS, LambdaDeployer
    from serving.deploy.cloud_promise import http_infer_event
    from tests.conftest import conv_channel_bundle

    url = emulator.url  # type: ignore[attr-defined]
    kw = {"endpoint_url": url, "region_name": "us-east-1"}
    lam, iam = boto3.client("lambda", **kw), boto3.client("iam", **kw)
    before = _inventory(url)
    opts = LambdaOptions(vendor=False, endpoint_url=url, fallback_transport=None)
    old = render_lambda_service(conv, tmp_path / "a", deployment="cc", options=opts)
    deployer = LambdaDeployer(endpoint_url=url)
    dep = deployer.deploy(old)
    x = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = reference_outputs(conv, {"x": x})["y"]
    deadline = time.monotonic() + 300
    while set(emulator.functions_running) != {"cc-master", "cc-worker-1", "cc-worker-2"}:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, emulator.functions_running  # type: ignore[attr-defined]
        time.sleep(0.1)

    def call(qualifier: str = ALIAS) -> np.ndarray:
        """A request as the function URL hands it to the master: POST /v2/models/cc/infer."""
        ev = http_infer_event("cc", {"x": x})
        resp = lam.invoke(FunctionName="cc-master", Qualifier=qualifier, Payload=json.dumps(ev).encode())
        body = resp["Payload"].read()
        assert not resp.get("FunctionError"), body[:500]
        doc = json.loads(body)
        assert doc["statusCode"] == 200, doc
        (out,) = json.loads(doc["body"])["outputs"]
        return np.asarray(out["data"], np.float32).reshape(out["shape"])

    assert np.abs(call() - want).max() <= 1e-4
    errors: list[BaseException] = []
    answers = [0]
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            try:
                got = call()
                assert np.abs(got - want).max() <= 1e-4
                answers[0] += 1
            except BaseException as e:  # noqa: BLE001 - the test reports every failure
                errors.append(e)

    t = threading.Thread(target=client)
    t.start()
    try:
        new_bundle = conv_channel_bundle(tmp_path / "b-bundle", assign=("master", "worker-1"), memory_mb=1024)
        new = render_lambda_service(new_bundle, tmp_path / "b", deployment="cc-r2", options=opts, model_name="cc")
        warmed: list[tuple[str, str]] = []

        def warm(function: str, version: str) -> None:
            warmed.append((function, version))
            for attempt in range(5):  # the new version's first request starts its serverless-offline
                try:
                    call(version)
                    return
                except AssertionError:
                    if attempt == 4:
                        raise

        now = deployer.swap(dep, new, warm=warm, drain_s=1.0)
    finally:
        stop.set()
        t.join(timeout=120)
    assert not errors, errors[:3]
    assert answers[0] > 0
    version = lam.get_alias(FunctionName="cc-master", Name=ALIAS)["FunctionVersion"]
    assert warmed == [("cc-master", version)] and version == now.versions["master"] != dep.versions["master"]
    assert lam.get_function_configuration(FunctionName="cc-master", Qualifier=ALIAS)["MemorySize"] == 1024
    assert np.abs(call() - want).max() <= 1e-4
    after = _inventory(url)
    assert after["functions"] - before["functions"] == {"cc-master", "cc-r2-worker-1"}
    assert after["roles"] - before["roles"] == {"flatpack-cc-master", "flatpack-cc-r2-worker"}
    policy = iam.get_role_policy(RoleName="flatpack-cc-master", PolicyName="flatpack")["PolicyDocument"]
    invokes = [r for st in policy["Statement"] if st["Sid"] == "InvokeOwnWorkers" for r in st["Resource"]]
    assert invokes and all(":function:cc-r2-worker-1" in r for r in invokes)
    assert sorted(deployer.undeploy(now))
    assert _inventory(url) == before


def _fast_lambda_profile(tmp_path: Path) -> Path:
    """The aws-lambda profile of a machine no machine is: ten times the CPU per MB, invocations in 0.1 ms. Every
    plan of a small model is predicted far under the milliseconds an emulated invocation takes."""
    doc = yaml.safe_load((Path(__file__).parents[2] / "platforms" / "aws-lambda.yaml").read_text())
    doc.update(name="impossibly-fast-lambda", mb_per_vcpu=177, billed_overhead_ms=0.0,
               invoke_latency_ms={"mu": 0.1, "sigma": 0.01, "tau": 0.01})
    path = tmp_path / "fast-lambda.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_deploy_slo_on_lambda_probes_re_plans_swaps_and_leaves_nothing_when_it_misses(emulator: object,
                                                                                      tmp_path: Path) -> None:
    """`deploy --target lambda --slo` keeps its promise as locally: it probes the master through the function
    URL's path, corrects the model, re-plans and swaps the plan in behind the same alias; where no plan meets
    the SLO live it says so, removes every function, role and bucket it made (the swapped-in ones too) and
    exits 2."""
    url = emulator.url  # type: ignore[attr-defined]
    model, before = _convs_and_users_bucket(url, tmp_path, layers=3)
    env = {**os.environ, "FLATPACK_STATE_DIR": str(tmp_path / "state"), "FLATPACK_CACHE_DIR": str(tmp_path / "cache"),
           "FLATPACK_S3_BUCKET": "users-bucket"}
    r = subprocess.run([sys.executable, "-m", "serving.cli", "deploy", str(model), "--target", "lambda",
                        "--endpoint-url", url, "--no-vendor", "--name", "cc", "--mode", "slo", "--slo", "1.5ms",
                        "--verify", "10", "--rounds", "2", "--platform", str(_fast_lambda_profile(tmp_path)),
                        "--profile", "flops"], capture_output=True, text=True, env=env, timeout=900, check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "round 1:" in out and "SLO missed live" in out and "removed cc" in out
    assert not (tmp_path / "state" / "deployments" / "cc.json").exists()
    assert _inventory(url) == before
    # the corrected model's plan (more memory) was swapped in behind the alias and measured before the verdict
    assert "deploying it beside the current one" in out and "round 2:" in out


def _convs_and_users_bucket(url: str, tmp_path: Path, *, layers: int) -> tuple[Path, object]:
    """A small conv stack written to ``tmp_path``, and the tensors' bucket over the payload limit created as the
    user's own (FLATPACK_S3_BUCKET, which deploy only uses); the emulator's inventory before any deploy."""
    import boto3
    import onnx

    from tests.onnx_builders import conv_stack

    model = tmp_path / "convs.onnx"
    onnx.save(conv_stack([{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 8}] * layers, cin=3, h=16,
                         w=16), str(model))
    boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(Bucket="users-bucket")
    return model, _inventory(url)


def test_watch_re_plans_a_lambda_deployment_once_under_an_injected_slowdown_and_not_under_noise(
        emulator: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`flatpack watch` on Lambda (serving/deploy/cloud_watch.py): deployed with an SLO (a 500 ms mean) the
    emulated invocations keep by far, `watch --once` says it holds (exit 0) and checks of the emulator's own
    noise re-plan nothing; with every invocation of the master slowed by 0.8 s (the emulator's ``delay_s``)
    the watch re-plans exactly once, swapping any new plan in behind the alias, records the decision, and
    decides nothing more in its cool-down; `undeploy` then removes what is live and leaves nothing. Every
    wait is a deadline-bounded poll."""
    from serving.deploy.cloud_watch import cloud_watcher
    from serving.deploy.watch import WatchSettings

    url = emulator.url  # type: ignore[attr-defined]
    model, before = _convs_and_users_bucket(url, tmp_path, layers=2)
    for k, v in {"FLATPACK_STATE_DIR": str(tmp_path / "state"), "FLATPACK_CACHE_DIR": str(tmp_path / "cache"),
                 "FLATPACK_S3_BUCKET": "users-bucket"}.items():
        monkeypatch.setenv(k, v)

    def flatpack(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "serving.cli", *args], capture_output=True, text=True,
                              env=os.environ.copy(), timeout=900, check=False)

    r = flatpack("deploy", str(model), "--target", "lambda", "--endpoint-url", url, "--no-vendor", "--name", "cc",
                 "--mode", "slo", "--slo", "500ms", "--verify", "5", "--rounds", "1",
                 "--platform", str(_fast_lambda_profile(tmp_path)), "--profile", "flops")
    assert r.returncode == 0, r.stdout + r.stderr
    record_path = tmp_path / "state" / "deployments" / "cc.json"
    options = json.loads(record_path.read_text())["options"]
    assert options["slo"] == {"slo_ms": 500.0, "percentile": None} and options["plan"]["request"]["slo_ms"] == 500
    once = flatpack("watch", "cc", "--once", "--requests", "5")
    assert once.returncode == 0, once.stdout + once.stderr
    assert "500 ms SLO over the last 5 probes" in once.stdout and "holds" in once.stdout

    settings = WatchSettings(every_s=0.01, checks=2, min_requests=5, window_requests=10, window_s=1e9,
                             cooldown_s=600.0)
    watcher = cloud_watcher("cc", settings=settings, requests=5, warmup=1, drain_s=1.0)
    try:
        noise = [watcher.check() for _ in range(4)]
        assert all(c.decision is None and not c.missed for c in noise), [c.line() for c in noise]
        emulator.delay_s["cc-master"] = 0.8  # type: ignore[attr-defined]
        deadline = time.monotonic() + 300
        while (check := watcher.check()).decision is None:
            assert time.monotonic() < deadline, "the watch did not re-plan under the slowdown"
        emulator.delay_s.clear()  # type: ignore[attr-defined]
        assert all(watcher.check().decision is None for _ in range(3))  # the cool-down
    finally:
        emulator.delay_s.clear()  # type: ignore[attr-defined]
        watcher.close()
    assert watcher.hysteresis.replans == 1
    decision = check.decision
    assert "500 ms SLO" in decision["reason"] and decision["live"]["met"] is False
    # the fast profile's plans are predicted far under any live figure, and a live correction is bounded
    # (partitioner.live.MAX_FACTOR): the corrected model keeps the plan here, which the decision says
    assert decision["outcome"].startswith(("kept the plan", "swapped in")), decision
    after = json.loads(record_path.read_text())["options"]
    assert after["watch"]["replans"] == 1 and after["watch"]["history"] == [decision]
    if decision["outcome"].startswith("swapped in"):  # the record names what is live
        assert after["generation"] == options.get("generation", 0) + 1 and after["cloud"] != options["cloud"]
    status = json.loads(flatpack("status", "cc", "--json").stdout)
    assert status["watch"]["replans"] == 1 and status["slo"]["slo_ms"] == 500
    u = flatpack("undeploy", "cc")
    assert u.returncode == 0, u.stdout + u.stderr
    assert _inventory(url) == before

"""Rendering a bundle as an AWS Lambda service directory (Serverless Framework v3, or boto3).

``render_lambda_service(bundle, out, deployment=...)`` writes::

    out/
      serverless.yml          the service: frameworkVersion '3', configValidationMode error; includes flatpack.yml
      flatpack.yml            what is generated per model: provider settings, one function per plan
                              function (memory, timeout, environment, its parts), the master's HTTP API
                              routes (Open Inference Protocol v2), the IAM roles, the bucket when one is needed
      flatpack_entry.py       the entry shim (templates/flatpack_entry.py): vendor/ on sys.path, then
                              functions.handlers.aws_lambda.handler
      functions/              the function runtime and its handlers, the same package the local platform runs
      vendor/                 numpy + onnxruntime as manylinux x86_64 wheels for the Lambda runtime
      bundle/                 plan.json, manifest.json, parts/*.onnx
      flatpack-service.json   what was rendered (read by the boto3 deployer, `undeploy` and the upload plugin)
      flatpack_bundle_upload.js   when parts go to S3: the plugin that uploads them during `serverless deploy`
      Dockerfile, requirements.txt   with ``backend="mxnet"`` only: the functions' container image

Paths in ``flatpack.yml`` start with ``${self:custom.flatpack.prefix}`` (empty here), so the repository's
top-level ``serverless.yml`` can deploy the same functions from the repository root.

Each function is packaged on its own (``package.individually``) with only the parts it runs. When the
code, dependencies and parts of a function would exceed Lambda's 250 MB unzipped limit, its parts stay
out of the package: they are uploaded to the deployment's bucket under ``bundles/<deployment>/<bundle
digest>/`` (:attr:`LambdaService.s3_bundle`; a new bundle never overwrites the files a running version
fetches) and fetched to ``/tmp`` at cold start (``FLATPACK_BUNDLE_S3_URI``); the function's role may read
exactly its deployment's bundle prefix. The boto3 deployer uploads them itself; with the Serverless
Framework, the service's own plugin (``flatpack_bundle_upload.js``) uploads them during ``serverless
deploy``: before the stack update when the bucket exists, else right after it creates the bucket.

Versions: every deploy publishes each function as a version and points its alias ``live`` at it (the
boto3 deployer through the API; the Serverless Framework through ``AWS::Lambda::Version`` resources named
by a digest of what the function runs, and ``AWS::Lambda::Alias``). The master invokes its workers at
``live`` (``FLATPACK_INVOKE_QUALIFIER``), and the HTTP API (or function URL) calls the master's ``live``,
so a redeploy never mixes versions inside one request; the roles may invoke the qualified ARNs.

With the MXNet backend (``LambdaOptions.backend="mxnet"``) MXNet 1.9 + numpy 1.23 + onnx alone exceed
that limit, so every function runs one container image instead (``templates/lambda/Dockerfile``, built
and pushed to ECR by ``serverless deploy`` through ``provider.ecr``); nothing is vendored and no part
goes to the bucket. The boto3 deployer does not build images: deploy such a service with the framework.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import templates
from functions.bundle import Bundle, sha256_file
from functions.config import FunctionConfig
from platforms import load_profile
from serving.deploy.aws_iam import LAMBDA_TRUST_POLICY, bundle_prefix, cfn_arn, role_policy, tensor_prefix
from serving.deploy.render import (
    CloudFunction,
    clear_rendered,
    cloud_functions,
    copy_bundle,
    copy_runtime,
    dir_bytes,
    runtime_requirements,
    write_json,
    write_yaml,
)
from serving.deploy.vendor import RUNTIMES, VendorError, vendor_dependencies

__all__ = [
    "ALIAS",
    "BUCKET_PLACEHOLDER",
    "HANDLER",
    "LAMBDA_UNZIPPED_LIMIT_BYTES",
    "LambdaOptions",
    "LambdaService",
    "REGION_PLACEHOLDER",
    "env_for_deploy",
    "render_lambda_service",
]

log = logging.getLogger(__name__)

#: Lambda's limit on a function's unzipped code (and layers): AWS Lambda quotas.
LAMBDA_UNZIPPED_LIMIT_BYTES = 250 * 1024 * 1024
HANDLER = "flatpack_entry.handler"
#: the alias every deploy points at the version it published; the master invokes its workers there
ALIAS = "live"
#: stand-ins in a function's environment, replaced by each deploy path (CloudFormation or boto3)
BUCKET_PLACEHOLDER = "@flatpack-bucket@"
REGION_PLACEHOLDER = "@aws-region@"
SERVICE_FILE = "flatpack-service.json"
UPLOAD_PLUGIN = "flatpack_bundle_upload.js"
_GENERATED = ("serverless.yml", "flatpack.yml", "flatpack_entry.py", "functions", "vendor", "bundle",
              SERVICE_FILE, ".serverless", ".cfnlintrc", "Dockerfile", "requirements.txt", UPLOAD_PLUGIN)
_IMAGE = "flatpack"  # the provider.ecr image every function of an MXNet service runs
# cfn-lint's configuration for the template `serverless package` writes (run `cfn-lint` in the directory)
_CFNLINTRC = """\
# cfn-lint for the CloudFormation template that `serverless package` writes: run `cfn-lint` here.
templates:
  - .serverless/cloudformation-template-update-stack.json
ignore_checks:
  # W3005 (DependsOn already implied by a Ref/GetAtt): the Serverless Framework itself adds DependsOn on
  # each function's role and on the HTTP API integration; redundant but harmless, and not in flatpack.yml.
  - W3005
"""
_ROLE_IDS = {"master": "FlatpackMasterRole", "worker": "FlatpackWorkerRole"}
_BUCKET_ID = "FlatpackBucket"
_BUCKET_OUTPUT = "FlatpackBucketName"


@dataclass(frozen=True)
class LambdaOptions:
    """How to render (and deploy) a bundle on AWS Lambda.

    Parameters
    ----------
    region: the AWS region (``--region`` of ``serverless`` overrides it in the rendered service).
    runtime: the Lambda Python runtime; ``python3.11`` is the newest the Serverless Framework v3 validates
        (see :mod:`serving.deploy.vendor` for the wheels each runtime gets).
    timeout_s: every function's timeout; the master's HTTP API integration allows at most 30 s.
    invoke_timeout_s: how long the master waits for one invocation of a worker before it gives up on that
        attempt (None: ``timeout_s``); shorter leaves time to retry within the master's own timeout.
    max_retries: further invocations of a worker after a retryable failure (crash, timeout, throttling).
    transport: how tensors move between functions (``inline`` inside the invocation, Gillis's way;
        ``redis``; ``s3``). ``shm`` is refused: Lambda functions share no host.
    fallback_transport: where ``inline`` puts tensors over Lambda's 6 MB payload limit (``s3``,
        ``redis`` or None to fail such requests).
    bucket: an existing S3 bucket for tensors and large bundles (None: the deployment creates one when
        it needs one).
    redis_url: the Redis the ``redis`` transport uses (must be reachable from the functions).
    endpoint_url: Lambda API endpoint override the master invokes workers through (serverless-offline's
        Lambda port, moto) — None on AWS.
    s3_endpoint_url: S3 endpoint override for the functions (None on AWS).
    http_api: give the master HTTP API routes speaking the Open Inference Protocol v2.
    vendor: install numpy + onnxruntime wheels into the package (off: bring them another way, e.g. a
        layer; tests that run the package with this machine's Python).
    strict_vendor: a vendoring failure raises (off: it is recorded in the service and rendering goes on).
    unzipped_limit_bytes: per function, above which its parts go to the bucket.
    api_token: when set, the master's HTTP routes require ``Authorization: Bearer <token>``.
    plugins: Serverless Framework plugins the service lists (``serverless-offline`` to run it locally;
        none by default, so ``serverless package`` needs nothing but the framework).
    backend: what runs the parts: ``onnxruntime`` (zip packages, the default) or ``mxnet`` (one
        container image for every function; ``vendor`` and ``unzipped_limit_bytes`` do not apply).
    """

    region: str = "us-east-1"
    runtime: str = "python3.11"
    timeout_s: int = 29
    invoke_timeout_s: float | None = None
    max_retries: int = 2
    transport: str = "inline"
    fallback_transport: str | None = "s3"
    bucket: str | None = None
    redis_url: str | None = None
    endpoint_url: str | None = None
    s3_endpoint_url: str | None = None
    http_api: bool = True
    vendor: bool = True
    strict_vendor: bool = False
    unzipped_limit_bytes: int = LAMBDA_UNZIPPED_LIMIT_BYTES
    api_token: str | None = None
    plugins: tuple[str, ...] = ()
    backend: str = "onnxruntime"

    def __post_init__(self) -> None:
        if self.backend not in ("onnxruntime", "mxnet"):
            raise ValueError(f"backend {self.backend!r} is not one of onnxruntime, mxnet")
        if self.transport == "shm" or self.fallback_transport == "shm":
            raise ValueError("the shm transport needs functions on one host; on AWS Lambda use --transport "
                             "inline (with an s3 or redis fallback), redis or s3")
        if self.transport not in ("inline", "redis", "s3"):
            raise ValueError(f"transport {self.transport!r} is not one of inline, redis, s3")
        if "redis" in (self.transport, self.fallback_transport) and not self.redis_url:
            raise ValueError("the redis transport needs --redis-url (a Redis the functions can reach)")
        if self.runtime not in RUNTIMES:
            raise ValueError(f"runtime {self.runtime!r}: use one of {sorted(RUNTIMES)}")
        if not 1 <= self.timeout_s <= 900:
            raise ValueError(f"timeout {self.timeout_s} s: Lambda allows 1..900 s")
        if self.http_api and self.timeout_s > 30:
            raise ValueError(f"timeout {self.timeout_s} s: an HTTP API waits at most 30 s for the master")
        if self.invoke_timeout_s is not None and not 0 < self.invoke_timeout_s <= self.timeout_s:
            raise ValueError(f"invoke timeout {self.invoke_timeout_s} s: give 0 < it <= the functions' timeout "
                             f"({self.timeout_s} s)")
        if self.max_retries < 0:
            raise ValueError(f"max_retries {self.max_retries}: give 0 or more")


@dataclass
class LambdaService:
    """A rendered service: what is in ``root`` and how it was made."""

    root: Path
    deployment: str
    model: str
    options: LambdaOptions
    functions: tuple[CloudFunction, ...]
    parts_in_s3: dict[str, bool]  # deployed function name -> its parts are fetched from the bucket
    package_bytes: dict[str, int]  # deployed function name -> unzipped package size
    vendored: bool = False
    vendor_error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def master(self) -> CloudFunction:
        return next(f for f in self.functions if f.role == "master")

    @property
    def tensors_in_s3(self) -> bool:
        return "s3" in (self.options.transport, self.options.fallback_transport)

    @property
    def needs_bucket(self) -> bool:
        return self.tensors_in_s3 or any(self.parts_in_s3.values())

    @property
    def bundle_dir(self) -> Path:
        return self.root / "bundle"

    @property
    def image(self) -> bool:
        """Its functions run a container image (the MXNet backend) rather than zip packages."""
        return self.options.backend != "onnxruntime"

    @property
    def s3_bundle_prefix(self) -> str:
        """Where in the bucket this bundle's files go: the deployment's bundle prefix, then the bundle's
        digest (a redeploy of another bundle never overwrites what a running version fetches)."""
        digest = sha256_file(self.bundle_dir / "manifest.json")[:12]
        return f"{bundle_prefix(self.deployment)}/{digest}"

    @property
    def s3_bundle_files(self) -> tuple[str, ...]:
        """The bundle files that go to the bucket: plan, manifest and the parts of every function whose
        parts do not fit its package (none when every function fits)."""
        big = [f for f in self.functions if self.parts_in_s3[f.name]]
        if not big:
            return ()
        return tuple(sorted({"plan.json", "manifest.json"} | {rel for f in big for rel in f.files}))

    def save(self) -> Path:
        doc = {
            "deployment": self.deployment,
            "model": self.model,
            "options": asdict(self.options) | {"api_token": None},
            "functions": [{**asdict(f), "files": list(f.files), "env": dict(f.env)} for f in self.functions],
            "parts_in_s3": self.parts_in_s3,
            "package_bytes": self.package_bytes,
            "vendored": self.vendored,
            "vendor_error": self.vendor_error,
            "extra": self.extra,
            # what the upload plugin (templates/lambda/flatpack_bundle_upload.js) reads
            "s3_bundle": {
                "bucket": self.options.bucket,
                "bucket_output": _BUCKET_OUTPUT,
                "prefix": self.s3_bundle_prefix,
                "files": list(self.s3_bundle_files),
                "remove_prefixes": [f"{bundle_prefix(self.deployment)}/", f"{tensor_prefix(self.deployment)}/"],
            } if self.s3_bundle_files else None,
        }
        return write_json(self.root / SERVICE_FILE, doc)

    @classmethod
    def load(cls, root: str | Path) -> LambdaService:
        root = Path(root)
        path = root / SERVICE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{root} is not a rendered Lambda service (no {SERVICE_FILE}); render one "
                                    f"with `flatpack deploy MODEL --target lambda --dry-run -o {root}`")
        d = json.loads(path.read_text())
        return cls(
            root=root,
            deployment=d["deployment"],
            model=d["model"],
            options=LambdaOptions(**{**d["options"], "plugins": tuple(d["options"].get("plugins", ()))}),
            functions=tuple(CloudFunction(**{**f, "files": tuple(f["files"])}) for f in d["functions"]),
            parts_in_s3={str(k): bool(v) for k, v in d["parts_in_s3"].items()},
            package_bytes={str(k): int(v) for k, v in d["package_bytes"].items()},
            vendored=bool(d["vendored"]),
            vendor_error=d.get("vendor_error"),
            extra=dict(d.get("extra") or {}),
        )


def render_lambda_service(bundle_dir: str | Path, out: str | Path, *, deployment: str,
                          options: LambdaOptions | None = None, model_name: str | None = None) -> LambdaService:
    """Write the service directory for ``bundle_dir`` (a verified bundle) at ``out``.

    ``deployment`` names the functions (``<deployment>-<plan function>``) and every transport key;
    ``model_name`` is the model's name on the HTTP routes (default: ``deployment``).
    """
    opts = options or LambdaOptions()
    bundle = Bundle.load(bundle_dir)
    plan = bundle.plan
    out = Path(out).resolve()
    clear_rendered(out, marker=SERVICE_FILE, generated=_GENERATED, what="service")
    out.mkdir(parents=True, exist_ok=True)
    model = model_name or deployment
    profile = load_profile("aws-lambda")
    for fn in plan.functions:
        profile.memory.check(fn.memory_mb)

    copy_runtime(out)
    shutil.copy2(templates.ENTRY, out / "flatpack_entry.py")
    copy_bundle(bundle, out / "bundle")
    vendored, vendor_error = False, None
    image = opts.backend != "onnxruntime"
    if image:
        shutil.copy2(templates.LAMBDA_IMAGE_DOCKERFILE, out / "Dockerfile")
        extra_reqs = ("redis>=5",) if "redis" in (opts.transport, opts.fallback_transport) else ()
        (out / "requirements.txt").write_text(runtime_requirements(opts.backend, extra_reqs))
    elif opts.vendor:
        extra = ("redis>=5",) if "redis" in (opts.transport, opts.fallback_transport) else ()
        try:
            vendor_dependencies(out / "vendor", runtime=opts.runtime, extra=extra)
            vendored = True
        except VendorError as e:
            if opts.strict_vendor:
                raise
            vendor_error = str(e)
            log.warning("dependencies not vendored: %s", e)

    base = FunctionConfig(
        bundle_dir=Path("bundle"),
        deployment=deployment,
        function=plan.master,
        transport=opts.transport,
        fallback_transport=opts.fallback_transport,
        payload_limit_bytes=profile.payload_limit_bytes,
        s3_bucket=opts.bucket or BUCKET_PLACEHOLDER,
        s3_endpoint_url=opts.s3_endpoint_url,
        redis_url=opts.redis_url or FunctionConfig.redis_url,
        aws_region=REGION_PLACEHOLDER,
        invoker="lambda",
        invoke_url=opts.endpoint_url,
        function_prefix=f"{deployment}-",
        invoke_qualifier=ALIAS,
        invoke_timeout_ms=int(1000 * (opts.invoke_timeout_s or opts.timeout_s)),
        max_retries=opts.max_retries,
        backend=opts.backend,
        model_name=model,
    )
    threads = {fn.memory_mb: profile.threads(fn.memory_mb) for fn in plan.functions}
    fns = cloud_functions(plan, deployment, base, threads=threads, drop=())
    common = (dir_bytes(out / "functions") + dir_bytes(out / "vendor") + (out / "flatpack_entry.py").stat().st_size
              + (out / "bundle" / "plan.json").stat().st_size + (out / "bundle" / "manifest.json").stat().st_size)
    parts_in_s3: dict[str, bool] = {}
    sizes: dict[str, int] = {}
    for f in fns:
        own = sum((out / "bundle" / rel).stat().st_size for rel in f.files)
        if image:  # the image holds the whole bundle; its limit (10 GB) is not the zip's
            parts_in_s3[f.name] = False
            sizes[f.name] = common + own
            continue
        parts_in_s3[f.name] = common + own > opts.unzipped_limit_bytes
        sizes[f.name] = common + (0 if parts_in_s3[f.name] else own)
        if common > opts.unzipped_limit_bytes:
            raise ValueError(f"the function code and dependencies alone take {common / 2**20:.0f} MB, over "
                             f"Lambda's {opts.unzipped_limit_bytes / 2**20:.0f} MB unzipped limit")
    service = LambdaService(out, deployment, model, opts, fns, parts_in_s3, sizes, vendored, vendor_error)
    if service.s3_bundle_files and not image:
        shutil.copy2(templates.LAMBDA_BUNDLE_UPLOAD_PLUGIN, out / UPLOAD_PLUGIN)
    write_yaml(out / "flatpack.yml", _flatpack_yml(service, plan.master),
               header=f"Generated by flatpack for deployment {deployment} (model {plan.model.name}); do not edit:\n"
                      f"render again with `flatpack deploy MODEL --target lambda --dry-run -o DIR`.")
    write_yaml(out / "serverless.yml", _serverless_yml(), header=_SERVERLESS_HEADER)
    (out / ".cfnlintrc").write_text(_CFNLINTRC)
    service.save()
    return service


_SERVERLESS_HEADER = """\
Serverless Framework v3 service of one flatpack deployment. The generated parts (functions, routes,
IAM roles, bucket) are in flatpack.yml, shared with the repository's top-level serverless.yml.
  serverless package --region us-east-1     # build the function packages and the CloudFormation template
  serverless deploy --region us-east-1      # deploy (needs AWS credentials)
  serverless offline --region us-east-1     # run locally (serverless-offline plugin)"""


def _serverless_yml() -> dict[str, Any]:
    inc = "${file(./flatpack.yml):%s}"
    return {
        "service": inc % "service",
        "frameworkVersion": "3",
        "configValidationMode": "error",
        "custom": {"flatpack": {"prefix": ""}},
        "plugins": inc % "plugins",
        "provider": inc % "provider",
        "package": inc % "package",
        "functions": inc % "functions",
        "resources": inc % "resources",
    }


def _env_value(value: str, *, bucket_ref: Any) -> Any:
    if value == BUCKET_PLACEHOLDER:
        return bucket_ref
    if value == REGION_PLACEHOLDER:
        return "${aws:region}"  # resolved from the provider's region, no network needed
    return value


def _flatpack_yml(service: LambdaService, master: str) -> dict[str, Any]:
    opts = service.options
    pre = "${self:custom.flatpack.prefix}"
    bucket_ref: Any = opts.bucket if opts.bucket else {"Ref": _BUCKET_ID}
    # what every function shares goes to the provider; the rest per function
    envs = [dict(f.env) for f in service.functions]
    common = {k: v for k, v in envs[0].items() if all(e.get(k) == v for e in envs[1:])}
    provider_env = {k: _env_value(v, bucket_ref=bucket_ref) for k, v in common.items()}
    if opts.api_token:
        provider_env["FLATPACK_API_TOKEN"] = opts.api_token
    provider: dict[str, Any] = {
        "name": "aws",
        "runtime": opts.runtime,
        "architecture": "x86_64",
        "region": "${opt:region, '" + opts.region + "'}",
        "stage": "${opt:stage, 'dev'}",
        "logRetentionInDays": 14,
        # each deploy publishes the versions this file declares (named by what they run), not the framework's
        "versionFunctions": False,
        "environment": provider_env,
    }
    if opts.http_api:
        provider["httpApi"] = {"payload": "2.0"}
    functions: dict[str, Any] = {}
    for f in service.functions:
        env = {k: _env_value(v, bucket_ref=bucket_ref) for k, v in f.env.items() if k not in common}
        patterns = [] if service.parts_in_s3[f.name] else [f"{pre}bundle/{rel}" for rel in f.files]
        if service.parts_in_s3[f.name]:
            where = f"/{service.s3_bundle_prefix}"
            env["FLATPACK_BUNDLE_S3_URI"] = (f"s3://{bucket_ref}{where}" if isinstance(bucket_ref, str)
                                             else {"Fn::Join": ["", ["s3://", bucket_ref, where]]})
        spec: dict[str, Any] = {
            "name": f.name,
            "description": f"flatpack {service.deployment}: {f.plan_name}",
            "handler": f"{pre}{HANDLER}",
            "memorySize": f.memory_mb,
            "timeout": opts.timeout_s,
            "role": _ROLE_IDS[f.role],
            "environment": env,
        }
        if service.image:
            del spec["handler"]
            spec["image"] = {"name": _IMAGE, "command": [HANDLER]}
        elif patterns:
            spec["package"] = {"patterns": patterns}
        if service.parts_in_s3[f.name]:
            # the parts are fetched to /tmp: room for them (Lambda offers 512..10240 MB)
            need = sum((service.root / "bundle" / rel).stat().st_size for rel in f.files)
            spec["ephemeralStorageSize"] = min(10240, max(512, int(need * 1.2 / 2**20) + 64))
        if f.role == "master" and opts.http_api:
            # every model name reaches the handler, which answers an unknown one as the local endpoint does
            spec["events"] = [{"httpApi": {"method": m, "path": p}} for m, p in _HTTP_ROUTES]
        key = "master" if f.role == "master" else f.plan_name
        functions[_function_key(key)] = spec
    resources: dict[str, Any] = {}
    extensions: dict[str, Any] = {}
    code = _code_digest(service.root)
    for key, spec in functions.items():
        logical = _logical_id(key)
        digest = hashlib.sha256((code + json.dumps(spec, sort_keys=True)).encode()).hexdigest()[:12]
        version = f"{logical}FlatpackVersion{digest}"
        resources[version] = {
            "Type": "AWS::Lambda::Version",
            # an older version stays while requests may still run on it; the alias moves on
            "DeletionPolicy": "Retain",
            "UpdateReplacePolicy": "Retain",
            "Properties": {"FunctionName": {"Ref": f"{logical}LambdaFunction"},
                           "Description": f"flatpack {service.deployment} ({digest})"},
        }
        resources[f"{logical}LiveAlias"] = {
            "Type": "AWS::Lambda::Alias",
            "Properties": {"FunctionName": {"Ref": f"{logical}LambdaFunction"}, "Name": ALIAS,
                           "FunctionVersion": {"Fn::GetAtt": [version, "Version"]}},
        }
        if "events" in spec:  # the master's HTTP API calls its alias, as the function URL does (boto3 path)
            alias = {"Ref": f"{logical}LiveAlias"}
            extensions[f"HttpApiIntegration{logical}"] = {"Properties": {"IntegrationUri": alias}}
            extensions[f"{logical}LambdaPermissionHttpApi"] = {"Properties": {"FunctionName": alias}}
    roles = sorted({f.role for f in service.functions}, key=lambda r: r != "master")
    for role in roles:
        resources[_ROLE_IDS[role]] = {
            "Type": "AWS::IAM::Role",
            "Properties": {
                "Description": f"flatpack {service.deployment}: the {role} function(s)",
                "AssumeRolePolicyDocument": LAMBDA_TRUST_POLICY,
                "Policies": [{
                    "PolicyName": f"flatpack-{service.deployment}-{role}",
                    "PolicyDocument": role_policy(
                        role, service.functions, deployment=service.deployment, arn=cfn_arn,
                        bucket=bucket_ref if service.needs_bucket else None,
                        bundle_in_s3=any(service.parts_in_s3[f.name] for f in service.functions if f.role == role),
                        tensors_in_s3=service.tensors_in_s3),
                }],
            },
        }
    outputs: dict[str, Any] = {}
    if service.needs_bucket and opts.bucket is None:
        resources[_BUCKET_ID] = {
            "Type": "AWS::S3::Bucket",
            "Properties": {
                "PublicAccessBlockConfiguration": {"BlockPublicAcls": True, "BlockPublicPolicy": True,
                                                   "IgnorePublicAcls": True, "RestrictPublicBuckets": True},
                "BucketEncryption": {"ServerSideEncryptionConfiguration": [
                    {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]},
                # tensors are deleted after use; the rule is the TTL backstop (DESIGN: every key has a TTL)
                "LifecycleConfiguration": {"Rules": [{"Id": "expire-tensors", "Status": "Enabled",
                                                      "Prefix": "flatpack/", "ExpirationInDays": 1}]},
            },
        }
        outputs[_BUCKET_OUTPUT] = {"Description": "bucket of this deployment's tensors and bundle files",
                                         "Value": {"Ref": _BUCKET_ID}}
    package = {
        "individually": True,
        "patterns": ["!**", f"{pre}flatpack_entry.py", f"{pre}functions/**", f"{pre}vendor/**",
                     f"{pre}bundle/plan.json", f"{pre}bundle/manifest.json", "!**/__pycache__/**", "!**/*.pyc"],
    }
    if service.image:
        provider["ecr"] = {"images": {_IMAGE: {"path": f"./{pre}", "platform": "linux/amd64"}}}
    plugins = list(opts.plugins)
    if (service.root / UPLOAD_PLUGIN).is_file():
        plugins.append(f"./{pre}{UPLOAD_PLUGIN.removesuffix('.js')}")
    doc: dict[str, Any] = {
        "service": f"flatpack-{service.deployment}",
        "plugins": plugins,
        "provider": provider,
        "package": package,
        "functions": functions,
        "resources": {"Resources": resources, **({"Outputs": outputs} if outputs else {}),
                      **({"extensions": extensions} if extensions else {})},
    }
    return doc


#: the master's HTTP API routes: the Open Inference Protocol v2 (functions.handlers.routes), every model route
#: with and without a version, Triton's read-only extensions, and the rest (the greedy route, matched last) so
#: that an unknown route or a wrong method is answered by the handler, with its ``{"error": ...}`` body
_MODEL_ROUTES = (("POST", "/infer"), ("GET", ""), ("GET", "/ready"), ("GET", "/config"), ("GET", "/stats"))
_HTTP_ROUTES = (
    *((method, f"/v2/models/{{name}}{version}{suffix}")
      for version in ("", "/versions/{version}") for method, suffix in _MODEL_ROUTES),
    ("GET", "/v2/models/stats"), ("POST", "/v2/repository/index"),
    ("GET", "/v2/health/live"), ("GET", "/v2/health/ready"), ("GET", "/v2"), ("*", "/{proxy+}"),
)


def _logical_id(key: str) -> str:
    """The CloudFormation logical id prefix the Serverless Framework gives function ``key``
    (``naming.getNormalizedFunctionName``: ``worker1`` -> ``Worker1``)."""
    name = key.replace("-", "Dash").replace("_", "Underscore")
    return name[:1].upper() + name[1:]


def _code_digest(root: Path) -> str:
    """A digest of what every function of the service runs: the entry shim, the function runtime, the
    vendored wheels (their RECORDs list each file's hash), the plan and manifest (which lists each part's
    sha256) and, for an image, its Dockerfile and requirements."""
    files = [root / "flatpack_entry.py", root / "bundle" / "plan.json", root / "bundle" / "manifest.json",
             root / "Dockerfile", root / "requirements.txt"]
    files += sorted(p for p in (root / "functions").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    files += sorted((root / "vendor").glob("*.dist-info/RECORD"))
    h = hashlib.sha256()
    for p in files:
        if p.is_file():
            h.update(f"{p.relative_to(root)}\0{sha256_file(p)}\n".encode())
    return h.hexdigest()


def _function_key(name: str) -> str:
    """A Serverless function key (becomes a CloudFormation logical id: letters and digits only)."""
    parts = [p for p in name.replace("_", "-").split("-") if p]
    return parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:]) if parts else "fn"


def env_for_deploy(f: CloudFunction, *, bucket: str | None, region: str) -> Mapping[str, str]:
    """A function's environment with the placeholders filled (the boto3 path)."""
    out = {}
    for k, v in f.env.items():
        if v == BUCKET_PLACEHOLDER:
            v = bucket or ""
        elif v == REGION_PLACEHOLDER:
            v = region
        out[k] = v
    return out

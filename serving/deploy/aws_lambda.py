"""Deploying a rendered Lambda service straight through the AWS APIs with boto3 (no Node needed).

:class:`LambdaDeployer` takes a :class:`serving.deploy.lambda_service.LambdaService` (the directory
``render_lambda_service`` wrote) and creates, in order: the bucket (when the deployment needs one and
none was given) with the bundle files that do not fit a package (:func:`upload_bundle_files`: the keys and
files the Serverless Framework path's plugin uploads too), the master's and the workers' IAM roles
with their inline policies (the same least-privilege statements the CloudFormation template has), one
function per plan function (published as a version, with an alias ``live``), and a function URL on the
master's alias. It waits until every function is Active and returns a :class:`LambdaDeployment`: the
exact list of what it created, which :meth:`LambdaDeployer.undeploy` removes and nothing else.
"""

from __future__ import annotations

import io
import logging
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from functions.bundle import sha256_file
from serving.deploy.aws_iam import LAMBDA_TRUST_POLICY, bundle_prefix, concrete_arn, role_policy, tensor_prefix
from serving.deploy.lambda_service import ALIAS, HANDLER, LambdaService, env_for_deploy

__all__ = ["ALIAS", "LambdaDeployer", "LambdaDeployment", "upload_bundle_files"]

log = logging.getLogger(__name__)

# CreateFunction takes a zip of at most 50 MB inline; bigger packages go through the bucket (AWS Lambda quotas)
_INLINE_ZIP_LIMIT = 50 * 2**20
# a role is not assumable by Lambda for a few seconds after IAM creates it (eventual consistency)
_ROLE_PROPAGATION_S = 60.0


@dataclass
class LambdaDeployment:
    """What one deployment created on AWS: enough to find and remove exactly that."""

    deployment: str
    region: str
    account: str
    endpoint_url: str | None = None
    bucket: str | None = None
    bucket_created: bool = False
    uploaded: list[str] = field(default_factory=list)  # object keys put in the bucket
    roles: dict[str, str] = field(default_factory=dict)  # role kind -> role name
    policies: dict[str, str] = field(default_factory=dict)  # role name -> inline policy name
    functions: dict[str, str] = field(default_factory=dict)  # plan function -> function ARN
    versions: dict[str, str] = field(default_factory=dict)  # plan function -> published version
    function_url: str | None = None
    model: str = ""

    @property
    def endpoint(self) -> str | None:
        return self.function_url.rstrip("/") if self.function_url else None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LambdaDeployment:
        return cls(**d)


class LambdaDeployer:
    """Creates and removes a deployment's AWS resources.

    Parameters
    ----------
    region: AWS region.
    endpoint_url: one endpoint for every AWS API (moto's server in tests; None on AWS).
    session: a ``boto3.session.Session`` (default: a new one from the usual credential chain).
    wait_s: how long to wait for functions to become Active.
    progress: called with a line per step.
    """

    def __init__(self, *, region: str = "us-east-1", endpoint_url: str | None = None, session: Any = None,
                 wait_s: float = 300.0, progress: Callable[[str], None] | None = None) -> None:
        try:
            import boto3
            import botocore.exceptions
        except ImportError as e:
            raise RuntimeError("deploying to AWS Lambda needs boto3: pip install 'flatpack[aws]'") from e
        self.region = region
        self.endpoint_url = endpoint_url
        self._session = session or boto3.session.Session()
        self._client_error = botocore.exceptions.ClientError
        self._wait_s = wait_s
        self._say = progress or (lambda _m: None)

    def _client(self, service: str) -> Any:
        return self._session.client(service, region_name=self.region, endpoint_url=self.endpoint_url)

    def _code(self, e: Exception) -> str:
        return str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))

    # ---------------------------------------------------------------------------------------------

    def deploy(self, service: LambdaService) -> LambdaDeployment:
        """Create everything; on failure, remove what was created so far and re-raise."""
        if service.options.vendor and not service.vendored:
            raise RuntimeError(f"the service at {service.root} has no vendored dependencies "
                               f"({service.vendor_error or 'rendered with vendoring off'}); render it again "
                               f"with vendoring, or deploy with the Serverless Framework and a layer")
        sts = self._client("sts")
        account = str(sts.get_caller_identity()["Account"])
        partition = self._session.get_partition_for_region(self.region) if hasattr(
            self._session, "get_partition_for_region") else "aws"
        dep = LambdaDeployment(service.deployment, self.region, account, self.endpoint_url, model=service.model)
        try:
            self._deploy(service, dep, concrete_arn(partition, self.region, account))
        except BaseException:
            log.warning("deployment %s failed; removing what was created", service.deployment)
            try:
                self.undeploy(dep)
            except Exception as e:  # noqa: BLE001 - the original failure is the one to report
                log.error("cleaning up after the failed deployment: %s", e)
            raise
        return dep

    def _deploy(self, service: LambdaService, dep: LambdaDeployment, arn: Callable[..., Any]) -> None:
        opts = service.options
        iam, lam, s3 = self._client("iam"), self._client("lambda"), self._client("s3")
        big = {f.name for f in service.functions if service.parts_in_s3[f.name]}
        zips = {f.name: self._zip(service, f.files if f.name not in big else ()) for f in service.functions}
        need_bucket = service.needs_bucket or any(len(z) > _INLINE_ZIP_LIMIT for z in zips.values())
        if need_bucket:
            dep.bucket = opts.bucket or f"flatpack-{service.deployment}-{dep.account}"[:63]
            if opts.bucket is None:
                self._say(f"creating bucket {dep.bucket}")
                kw: dict[str, Any] = {}
                if self.region != "us-east-1":
                    kw["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
                s3.create_bucket(Bucket=dep.bucket, **kw)
                dep.bucket_created = True
                s3.put_public_access_block(Bucket=dep.bucket, PublicAccessBlockConfiguration={
                    "BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True,
                    "RestrictPublicBuckets": True})
                s3.put_bucket_lifecycle_configuration(Bucket=dep.bucket, LifecycleConfiguration={"Rules": [
                    {"ID": "expire-tensors", "Status": "Enabled", "Filter": {"Prefix": "flatpack/"},
                     "Expiration": {"Days": 1}}]})
            if big:
                self._say(f"uploading {len(service.s3_bundle_files)} bundle files to "
                          f"s3://{dep.bucket}/{service.s3_bundle_prefix}/")
                dep.uploaded += upload_bundle_files(s3, service, dep.bucket)
        roles = sorted({f.role for f in service.functions}, key=lambda r: r != "master")
        role_arns: dict[str, str] = {}
        for role in roles:
            name = f"flatpack-{service.deployment}-{role}"[:64]
            self._say(f"creating IAM role {name}")
            resp = iam.create_role(RoleName=name, AssumeRolePolicyDocument=_json(LAMBDA_TRUST_POLICY),
                                   Description=f"flatpack {service.deployment}: the {role} function(s)",
                                   Tags=[{"Key": "flatpack:deployment", "Value": service.deployment}])
            dep.roles[role] = name
            role_arns[role] = resp["Role"]["Arn"]
            policy = role_policy(role, service.functions, deployment=service.deployment, arn=arn,
                                 bucket=dep.bucket if service.needs_bucket else None,
                                 bundle_in_s3=any(f.name in big for f in service.functions if f.role == role),
                                 tensors_in_s3=service.tensors_in_s3 and dep.bucket is not None)
            iam.put_role_policy(RoleName=name, PolicyName="flatpack", PolicyDocument=_json(policy))
            dep.policies[name] = "flatpack"
        for f in service.functions:
            resp = self._create_function(lam, self._function_kwargs(service, dep, s3, f, zips[f.name], big,
                                                                    role_arns[f.role]))
            dep.functions[f.plan_name] = resp["FunctionArn"]
            dep.versions[f.plan_name] = str(resp.get("Version") or "$LATEST")
        self._wait_active(lam, [f.name for f in service.functions])
        for f in service.functions:
            lam.create_alias(FunctionName=f.name, Name=ALIAS, FunctionVersion=dep.versions[f.plan_name],
                             Description="the version flatpack deployed")
        if opts.http_api:
            master = service.master.name
            url = lam.create_function_url_config(FunctionName=master, Qualifier=ALIAS, AuthType="NONE")
            # NONE: the endpoint is public like any HTTP API; FLATPACK_API_TOKEN (if set) guards it in the handler
            lam.add_permission(FunctionName=master, Qualifier=ALIAS, StatementId="flatpack-function-url",
                               Action="lambda:InvokeFunctionUrl", Principal="*", FunctionUrlAuthType="NONE")
            dep.function_url = url["FunctionUrl"]

    def _function_kwargs(self, service: LambdaService, dep: LambdaDeployment, s3: Any, f: Any, package: bytes,
                         big: set[str], role_arn: str) -> dict[str, Any]:
        """CreateFunction's arguments for ``f``: its environment, its package (inline, or put in the bucket
        when too big), its scratch space, its role. Puts the package in the bucket where it goes there."""
        opts = service.options
        env = dict(env_for_deploy(f, bucket=dep.bucket, region=self.region))
        if f.name in big:
            env["FLATPACK_BUNDLE_S3_URI"] = f"s3://{dep.bucket}/{service.s3_bundle_prefix}"
        if f.role == "master" and opts.api_token:
            env["FLATPACK_API_TOKEN"] = opts.api_token
        code: dict[str, Any]
        if len(package) > _INLINE_ZIP_LIMIT:
            key = f"{bundle_prefix(service.deployment)}/code/{f.name}.zip"
            s3.put_object(Bucket=dep.bucket, Key=key, Body=package)
            dep.uploaded.append(key)
            code = {"S3Bucket": dep.bucket, "S3Key": key}
        else:
            code = {"ZipFile": package}
        kw: dict[str, Any] = {}
        if f.name in big:
            need = sum((service.bundle_dir / rel).stat().st_size for rel in f.files)
            kw["EphemeralStorage"] = {"Size": min(10240, max(512, int(need * 1.2 / 2**20) + 64))}
        self._say(f"creating function {f.name} ({f.memory_mb} MB)")
        return dict(FunctionName=f.name, Runtime=opts.runtime, Role=role_arn, Handler=HANDLER, Code=code,
                    Description=f"flatpack {service.deployment}: {f.plan_name}", Timeout=opts.timeout_s,
                    MemorySize=f.memory_mb, Publish=True, Architectures=["x86_64"],
                    Environment={"Variables": env}, Tags={"flatpack:deployment": service.deployment}, **kw)

    # ---------------------------------------------------------------------------------------------

    def swap(self, dep: LambdaDeployment, service: LambdaService, *, warm: Callable[[str, str], None],
             drain_s: float = 10.0) -> LambdaDeployment:
        """Make ``service`` (a new plan of ``dep``'s model, rendered under a new deployment name) the plan
        that ``dep``'s endpoint serves, blue/green, with the endpoint unchanged:

        1. the new plan's workers are created beside the old ones (their own role), and the master's role
           may invoke both;
        2. the master function (the one the endpoint calls) gets the new plan's package and settings as a
           new published version, which ``warm(function, version)`` invokes directly until it is warm;
        3. the master's ``live`` alias (what the endpoint calls) moves to that version: the switch;
        4. after ``drain_s`` for requests the old version still runs, the old workers and their role are
           removed, and the master's role may invoke only the new workers.

        Returns the deployment as it now stands (what ``undeploy`` removes). If a step before the switch
        fails, what the swap created is removed and the old plan keeps serving."""
        if service.options.vendor and not service.vendored:
            raise RuntimeError(f"the service at {service.root} has no vendored dependencies; render it again")
        iam, lam, s3 = self._client("iam"), self._client("lambda"), self._client("s3")
        arn = concrete_arn(self._session.get_partition_for_region(self.region) if hasattr(
            self._session, "get_partition_for_region") else "aws", self.region, dep.account)
        master_name = dep.functions[service.master.plan_name].rsplit(":", 1)[-1]
        master = replace(service.master, name=master_name)  # the new plan's master, as the function it replaces
        workers = [f for f in service.functions if f.role == "worker"]
        big = {f.name for f in service.functions if service.parts_in_s3[f.name]}
        if big and dep.bucket is None:
            raise RuntimeError("the new plan's parts need a bucket, and the deployment has none: deploy it anew")
        new = LambdaDeployment(service.deployment, dep.region, dep.account, dep.endpoint_url, bucket=dep.bucket,
                               model=service.model)
        if big:
            new.uploaded += upload_bundle_files(s3, service, str(dep.bucket))
        tensors = service.tensors_in_s3 and dep.bucket is not None

        def master_policy(functions: list[Any]) -> dict[str, Any]:
            return role_policy("master", functions, deployment=service.deployment, arn=arn,
                               bucket=dep.bucket if service.needs_bucket else None,
                               bundle_in_s3=master.name in big, tensors_in_s3=tensors)

        old_workers = {k: v for k, v in dep.functions.items() if k != service.master.plan_name}
        master_role = dep.roles["master"]
        old_policy = iam.get_role_policy(RoleName=master_role, PolicyName=dep.policies[master_role])["PolicyDocument"]
        switched = False
        try:
            if workers:
                name = f"flatpack-{service.deployment}-worker"[:64]
                self._say(f"creating IAM role {name}")
                resp = iam.create_role(RoleName=name, AssumeRolePolicyDocument=_json(LAMBDA_TRUST_POLICY),
                                       Description=f"flatpack {service.deployment}: the worker function(s)",
                                       Tags=[{"Key": "flatpack:deployment", "Value": service.deployment}])
                new.roles["worker"] = name
                worker_arn = resp["Role"]["Arn"]
                policy = role_policy("worker", workers, deployment=service.deployment, arn=arn,
                                     bucket=dep.bucket if service.needs_bucket else None,
                                     bundle_in_s3=any(f.name in big for f in workers), tensors_in_s3=tensors)
                iam.put_role_policy(RoleName=name, PolicyName="flatpack", PolicyDocument=_json(policy))
                new.policies[name] = "flatpack"
                for f in workers:
                    made = self._create_function(lam, self._function_kwargs(
                        service, new, s3, f, self._zip(service, f.files if f.name not in big else ()), big,
                        worker_arn))
                    new.functions[f.plan_name] = made["FunctionArn"]
                    new.versions[f.plan_name] = str(made.get("Version") or "$LATEST")
                self._wait_active(lam, [f.name for f in workers])
                for f in workers:
                    lam.create_alias(FunctionName=f.name, Name=ALIAS, FunctionVersion=new.versions[f.plan_name],
                                     Description="the version flatpack deployed")
            # the master may invoke the old workers (the version serving now) and the new ones (the next)
            both = master_policy([master, *workers])
            both["Statement"] = _merged(old_policy["Statement"], both["Statement"])
            iam.put_role_policy(RoleName=master_role, PolicyName=dep.policies[master_role], PolicyDocument=_json(both))
            kw = self._function_kwargs(service, new, s3, master, self._zip(
                service, master.files if master.name not in big else ()), big, "")
            self._say(f"updating function {master_name}: the new plan as a new version")
            lam.update_function_code(FunctionName=master_name, Publish=False, **kw["Code"])
            self._wait_active(lam, [master_name])
            lam.update_function_configuration(FunctionName=master_name, MemorySize=kw["MemorySize"],
                                              Timeout=kw["Timeout"], Environment=kw["Environment"],
                                              Description=kw["Description"],
                                              **({"EphemeralStorage": kw["EphemeralStorage"]}
                                                 if "EphemeralStorage" in kw else {}))
            self._wait_active(lam, [master_name])
            version = str(lam.publish_version(FunctionName=master_name)["Version"])
            self._say(f"warming {master_name}:{version}")
            warm(master_name, version)
            lam.update_alias(FunctionName=master_name, Name=ALIAS, FunctionVersion=version)
            switched = True
        except BaseException:
            if not switched:
                log.warning("swap to %s failed before the switch; removing what it created", service.deployment)
                try:
                    iam.put_role_policy(RoleName=master_role, PolicyName=dep.policies[master_role],
                                        PolicyDocument=_json(old_policy))
                    self.undeploy(new)
                except Exception as e:  # noqa: BLE001 - the original failure is the one to report
                    log.error("cleaning up after the failed swap: %s", e)
            raise
        self._say(f"switched {master_name}'s alias {ALIAS} to version {version}; draining the old plan")
        time.sleep(drain_s)  # requests the old version took still invoke the old workers
        gone = LambdaDeployment(dep.deployment, dep.region, dep.account, dep.endpoint_url, functions=old_workers,
                                roles={k: v for k, v in dep.roles.items() if k != "master"},
                                policies={k: v for k, v in dep.policies.items() if k != master_role})
        self.undeploy(gone)
        iam.put_role_policy(RoleName=master_role, PolicyName=dep.policies[master_role],
                            PolicyDocument=_json(master_policy([master, *workers])))
        return LambdaDeployment(
            service.deployment, dep.region, dep.account, dep.endpoint_url, bucket=dep.bucket,
            bucket_created=dep.bucket_created, uploaded=[*dep.uploaded, *new.uploaded],
            roles={"master": master_role, **new.roles}, policies={master_role: dep.policies[master_role],
                                                                    **new.policies},
            functions={service.master.plan_name: dep.functions[service.master.plan_name], **new.functions},
            versions={service.master.plan_name: version, **new.versions}, function_url=dep.function_url,
            model=service.model)

    def _create_function(self, lam: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        end = time.monotonic() + _ROLE_PROPAGATION_S
        delay = 1.0
        while True:
            try:
                return lam.create_function(**kwargs)
            except self._client_error as e:
                msg = str(e)
                if (self._code(e) == "InvalidParameterValueException" and "role" in msg.lower()
                        and time.monotonic() < end):
                    time.sleep(delay)  # the new role has not reached Lambda yet
                    delay = min(8.0, delay * 2)
                    continue
                raise

    def _wait_active(self, lam: Any, names: list[str]) -> None:
        end = time.monotonic() + self._wait_s
        pending = list(names)
        while pending:
            still = []
            for n in pending:
                cfg = lam.get_function_configuration(FunctionName=n)
                state = cfg.get("State", "Active")
                if state == "Failed":
                    raise RuntimeError(f"function {n} failed to become active: {cfg.get('StateReason')}")
                if state != "Active" or cfg.get("LastUpdateStatus", "Successful") == "InProgress":
                    still.append(n)
            if not still:
                return
            if time.monotonic() > end:
                raise TimeoutError(f"functions {still} were not Active after {self._wait_s:.0f} s")
            time.sleep(1.0)
            pending = still

    @staticmethod
    def _zip(service: LambdaService, files: tuple[str, ...]) -> bytes:
        """The package of one function: entry point, runtime, dependencies, plan, manifest, its parts."""
        root = service.root
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as z:
            paths: list[Path] = [root / "flatpack_entry.py", root / "bundle" / "plan.json",
                                 root / "bundle" / "manifest.json"]
            for d in ("functions", "vendor"):
                if (root / d).is_dir():
                    paths += sorted(p for p in (root / d).rglob("*")
                                    if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
            paths += [root / "bundle" / rel for rel in files]
            for p in paths:
                info = zipfile.ZipInfo(str(p.relative_to(root)), date_time=(1980, 1, 1, 0, 0, 0))
                info.external_attr = (0o755 if p.stat().st_mode & 0o111 else 0o644) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, p.read_bytes())
        return buf.getvalue()

    # ---------------------------------------------------------------------------------------------

    def undeploy(self, dep: LambdaDeployment) -> list[str]:
        """Remove what ``dep`` lists, newest first; returns what was removed. Missing things are skipped."""
        removed: list[str] = []
        lam, iam = self._client("lambda"), self._client("iam")
        gone = ("ResourceNotFoundException", "NoSuchEntity", "NoSuchBucket", "NoSuchKey", "404")
        for function_arn in reversed(list(dep.functions.values())):
            name = function_arn.rsplit(":", 1)[-1]
            try:
                lam.delete_function(FunctionName=name)  # its versions, aliases and URL go with it
                removed.append(f"function {name}")
            except self._client_error as e:
                if self._code(e) not in gone:
                    raise
        for name in reversed(list(dep.roles.values())):
            try:
                policy = dep.policies.get(name)
                if policy:
                    iam.delete_role_policy(RoleName=name, PolicyName=policy)
                    removed.append(f"policy {name}/{policy}")
                iam.delete_role(RoleName=name)
                removed.append(f"role {name}")
            except self._client_error as e:
                if self._code(e) not in gone:
                    raise
        if dep.bucket:
            s3 = self._client("s3")
            keys = list(dep.uploaded)
            if dep.bucket_created:
                keys = self._list(s3, dep.bucket, "")  # everything in a bucket we created is ours
            else:
                keys += self._list(s3, dep.bucket, f"{tensor_prefix(dep.deployment)}/")
            for i in range(0, len(keys), 1000):
                batch = keys[i:i + 1000]
                if batch:
                    s3.delete_objects(Bucket=dep.bucket, Delete={"Objects": [{"Key": k} for k in batch],
                                                                 "Quiet": True})
            if keys:
                removed.append(f"{len(keys)} objects in s3://{dep.bucket}")
            if dep.bucket_created:
                try:
                    s3.delete_bucket(Bucket=dep.bucket)
                    removed.append(f"bucket {dep.bucket}")
                except self._client_error as e:
                    if self._code(e) not in gone:
                        raise
        return removed

    def _list(self, s3: Any, bucket: str, prefix: str) -> list[str]:
        keys: list[str] = []
        try:
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                keys += [o["Key"] for o in page.get("Contents", ())]
        except self._client_error as e:
            if self._code(e) not in ("NoSuchBucket", "404"):
                raise
        return keys


def upload_bundle_files(s3: Any, service: LambdaService, bucket: str) -> list[str]:
    """Put ``service.s3_bundle_files`` under ``s3://bucket/<service.s3_bundle_prefix>/`` (each with its
    sha256 as object metadata, which the Serverless Framework plugin compares too); returns the keys."""
    keys = []
    for rel in service.s3_bundle_files:
        path = service.bundle_dir / rel
        key = f"{service.s3_bundle_prefix}/{rel}"
        s3.upload_file(str(path), bucket, key, ExtraArgs={"Metadata": {"sha256": sha256_file(path)}})
        keys.append(key)
    return keys


def _json(doc: Any) -> str:
    import json

    return json.dumps(doc, separators=(",", ":"))


def _merged(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Two policies' statements as one: statements with the same ``Sid`` have their resources joined."""
    out: dict[str, dict[str, Any]] = {}
    for st in (*a, *b):
        sid = st.get("Sid", "")
        have = out.get(sid)
        if have is None:
            out[sid] = dict(st)
            continue
        res = [*_listed(have.get("Resource")), *_listed(st.get("Resource"))]
        have["Resource"] = list(dict.fromkeys(res))
    return list(out.values())


def _listed(resource: Any) -> list[Any]:
    return list(resource) if isinstance(resource, list) else [] if resource is None else [resource]

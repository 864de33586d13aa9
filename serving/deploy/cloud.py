"""`flatpack deploy --target lambda|openfaas` and `undeploy` of such deployments, without the printing.

``deploy_cloud`` renders the service for a bundle (``serving.deploy.lambda_service`` /
``serving.deploy.openfaas``) and, unless it is a dry run, deploys it (boto3 / the gateway's API) and
records what it created as a :class:`DeploymentRecord` (``target`` = the cloud, ``options["cloud"]`` =
the exact resources), which ``undeploy_cloud`` removes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from functions import settings
from serving.deploy.state import DeploymentRecord, state_dir

__all__ = ["CloudResult", "deploy_cloud", "undeploy_cloud"]


@dataclass
class CloudResult:
    target: str
    name: str
    rendered: Path
    endpoint: str | None = None
    record: DeploymentRecord | None = None
    warnings: list[str] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)


def deploy_cloud(target: str, name: str, model: Path, bundle: Path, *, transport: str, mode: str, dry_run: bool,
                 out_dir: str | None, region: str | None, endpoint_url: str | None, gateway: str | None,
                 vendor: bool = True, progress: Callable[[str], None] | None = None,
                 backend: str = "onnxruntime") -> CloudResult:
    """Render (and unless ``dry_run`` deploy) ``bundle`` on ``target`` as deployment ``name``.

    ``backend`` ``mxnet`` renders functions that run their parts with MXNet (on Lambda: one container
    image, which only ``serverless deploy`` builds and pushes, so that needs ``dry_run``).

    Redis and an existing bucket come from ``FLATPACK_REDIS_URL`` and ``FLATPACK_S3_BUCKET``; the API token
    guarding the endpoint from ``FLATPACK_API_TOKEN``.
    """
    say = progress or (lambda _m: None)
    out = Path(out_dir) if out_dir else state_dir() / target / name
    redis_url = settings.configured_redis_url()
    if target == "lambda":
        from serving.deploy.lambda_service import LambdaOptions, render_lambda_service

        region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        opts = LambdaOptions(region=region, transport=transport, redis_url=redis_url, endpoint_url=endpoint_url,
                             bucket=settings.s3_bucket(), vendor=vendor,
                             strict_vendor=not dry_run, api_token=settings.api_token(),
                             fallback_transport=(None if transport != "inline" else "redis" if redis_url else "s3"),
                             backend=backend)
        if backend != "onnxruntime" and not dry_run:
            raise ValueError(f"{backend} functions on Lambda run a container image, which flatpack's boto3 deployer "
                             f"does not build: render with --dry-run -o DIR, then `cd DIR && serverless deploy` "
                             f"(it builds the image and pushes it to ECR)")
        say(f"rendering the Lambda service in {out}")
        service = render_lambda_service(bundle, out, deployment=name, options=opts)
        res = CloudResult(target, name, service.root)
        if service.vendor_error:
            res.warnings.append(f"dependencies not vendored: {service.vendor_error}")
        for fn, in_s3 in service.parts_in_s3.items():
            if in_s3:
                res.warnings.append(f"{fn}: its parts exceed the package limit and are fetched from S3 at cold start")
        res.next_steps = [f"cd {service.root} && serverless package --region {region}",
                          f"cd {service.root} && cfn-lint"]
        if service.image:
            res.next_steps = [f"cd {service.root} && serverless deploy --region {region}   # builds the {backend} "
                              f"image, pushes it to ECR"]
        if dry_run:
            return res
        from serving.deploy.aws_lambda import LambdaDeployer

        dep = LambdaDeployer(region=region, endpoint_url=endpoint_url, progress=say).deploy(service)
        res.endpoint = dep.endpoint
        res.record = DeploymentRecord(name=name, model=str(model), bundle=str(bundle), target="lambda",
                                      transport=transport, mode=mode, endpoint=dep.endpoint, status="ready",
                                      deployment_id=name, functions=_functions(bundle),
                                      options={"cloud": dep.to_json(), "rendered": str(service.root)})
        res.record.save()
        return res
    if target == "openfaas":
        from serving.deploy.openfaas import OpenFaaSOptions, render_openfaas_stack

        gw = gateway or os.environ.get("OPENFAAS_URL") or "http://127.0.0.1:8080"
        ofopts = OpenFaaSOptions(gateway=gw, transport=transport, redis_url=redis_url,
                                 image=settings.openfaas_image(),
                                 function_gateway=settings.openfaas_function_gateway(),
                                 backend=backend)
        say(f"rendering the OpenFaaS stack in {out}")
        stack = render_openfaas_stack(bundle, out, deployment=name, options=ofopts)
        res = CloudResult(target, name, stack.root)
        res.next_steps = [f"faas-cli up -f {stack.root / 'stack.yml'}"]
        if transport == "shm":
            res.next_steps.insert(0, f"kubectl apply -f {stack.root / 'kubernetes'}/profile.yml")
        if dry_run:
            return res
        from serving.deploy.openfaas import OpenFaaSDeployer

        odep = OpenFaaSDeployer(gw, progress=say).deploy(stack)
        res.endpoint = f"{gw.rstrip('/')}/function/{stack.master.name}"
        res.record = DeploymentRecord(name=name, model=str(model), bundle=str(bundle), target="openfaas",
                                      transport=transport, mode=mode, endpoint=res.endpoint, status="ready",
                                      deployment_id=name, functions=_functions(bundle),
                                      options={"cloud": odep.to_json(), "rendered": str(stack.root)})
        res.record.save()
        return res
    raise ValueError(f"unknown cloud target {target!r}; use lambda or openfaas")


def _functions(bundle: Path) -> list[dict]:
    from functions.plan import Plan

    return [f.to_json() for f in Plan.load(bundle / "plan.json").functions]


def undeploy_cloud(record: DeploymentRecord, progress: Callable[[str], None] | None = None) -> list[str]:
    """Remove what ``record``'s deployment created; the record is deleted once that succeeded."""
    cloud = dict(record.options.get("cloud") or {})
    if record.target == "lambda":
        from serving.deploy.aws_lambda import LambdaDeployer, LambdaDeployment

        dep = LambdaDeployment.from_json(cloud)
        removed = LambdaDeployer(region=dep.region, endpoint_url=dep.endpoint_url, progress=progress).undeploy(dep)
    elif record.target == "openfaas":
        from serving.deploy.openfaas import OpenFaaSDeployer, OpenFaaSDeployment

        odep = OpenFaaSDeployment.from_json(cloud)
        removed = OpenFaaSDeployer(odep.gateway, progress=progress).undeploy(odep)
    else:
        raise ValueError(f"deployment {record.name} is on target {record.target!r}, not a cloud")
    record.delete()
    return removed

"""The promise loop on AWS Lambda: probing a deployment through its master, and swapping its plan blue/green.

:func:`serving.deploy.promise.keep_promise` runs wherever something can probe the deployment and swap its
plan. On Lambda:

* :class:`LambdaProbe` sends requests the way the deployment's function URL hands them to the master (an
  HTTP event of payload format 2.0 for ``POST /v2/models/NAME/infer``), through ``lambda.invoke`` of the
  master's ``live`` alias, and times each round trip here. It is the endpoint's own path less the URL's
  front door, which an emulator does not run.
* :class:`LambdaSwap` exports the new plan, renders it as a service under a new deployment name
  (``NAME-rN``), and hands it to :meth:`serving.deploy.aws_lambda.LambdaDeployer.swap`: new workers beside
  the old, the master's new version warmed through its version qualifier, the ``live`` alias moved (the
  switch: the endpoint is unchanged), the old workers removed after a drain. The deployment's record then
  names what ``undeploy`` must remove.

OpenFaaS deploys images, which a plan swapped in would need built and pushed first: there the loop gives
its verdict after one probe (``flatpack deploy`` says so).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from serving.deploy.promise import Probed, export_round

if TYPE_CHECKING:
    from partitioner.graph import LayerGraph
    from partitioner.planner import PlanRequest
    from partitioner.solvers.common import SolverResult
    from serving.deploy.state import DeploymentRecord

__all__ = ["LambdaProbe", "LambdaSwap", "http_infer_event"]

_WARM_REQUESTS = 3


def http_infer_event(model_name: str, inputs: dict[str, np.ndarray], *, token: str | None = None) -> dict[str, Any]:
    """The event a Lambda function URL hands the master for ``POST /v2/models/MODEL/infer`` with ``inputs``
    as the Open Inference Protocol's JSON (payload format 2.0)."""
    from functions import json_codec
    from functions.inference_protocol import datatype_of

    doc = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": datatype_of(v.dtype), "data": v.reshape(-1)}
                      for k, v in inputs.items()]}
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    path = f"/v2/models/{model_name}/infer"
    return {"version": "2.0", "routeKey": "$default", "rawPath": path, "rawQueryString": "", "headers": headers,
            "requestContext": {"http": {"method": "POST", "path": path}},
            "body": json_codec.dumps(doc).decode(), "isBase64Encoded": False}


class _Master:
    """The deployment's master function on Lambda, invoked as its function URL would."""

    def __init__(self, record: DeploymentRecord, model: Any, *, token: str | None) -> None:
        import boto3

        from partitioner.inputs import random_inputs
        from serving.deploy.aws_lambda import LambdaDeployment

        dep = LambdaDeployment.from_json(dict(record.options["cloud"]))
        self.region, self.endpoint_url = dep.region, dep.endpoint_url
        self.name = record.name
        self.model_name = dep.model or record.name
        self.lam = boto3.client("lambda", region_name=dep.region, endpoint_url=dep.endpoint_url)
        self.events = [json.dumps(http_infer_event(self.model_name, random_inputs(model, i), token=token)).encode()
                       for i in range(4)]

    def function(self, record: DeploymentRecord) -> str:
        from functions.plan import Plan
        from serving.deploy.aws_lambda import LambdaDeployment

        dep = LambdaDeployment.from_json(dict(record.options["cloud"]))
        master = Plan.load(Path(record.bundle) / "plan.json").master
        return dep.functions[master].rsplit(":", 1)[-1]

    def invoke(self, function: str, qualifier: str, i: int) -> None:
        resp = self.lam.invoke(FunctionName=function, Qualifier=qualifier, InvocationType="RequestResponse",
                               Payload=self.events[i % len(self.events)])
        body = resp["Payload"].read()
        if resp.get("FunctionError"):
            raise RuntimeError(f"{function}:{qualifier} failed: {body[:300].decode(errors='replace')}")
        status = int(json.loads(body).get("statusCode", 200))
        if status != 200:
            raise RuntimeError(f"{function}:{qualifier} answered HTTP {status}: {body[:300].decode(errors='replace')}")


class LambdaProbe:
    """A :class:`serving.deploy.promise.Probe` of a Lambda deployment (see the module docstring)."""

    def __init__(self, name: str, model: Any, *, token: str | None = None, warmup: int = 3) -> None:
        from serving.deploy.state import DeploymentRecord

        self._name = name
        self._master = _Master(DeploymentRecord.load(name), model, token=token)
        self._warmup = warmup

    def __call__(self, requests: int) -> Probed:
        from serving.deploy.aws_lambda import ALIAS
        from serving.deploy.state import DeploymentRecord

        function = self._master.function(DeploymentRecord.load(self._name))
        for i in range(self._warmup):
            self._master.invoke(function, ALIAS, i)
        out = []
        for i in range(requests):
            t0 = time.perf_counter()
            self._master.invoke(function, ALIAS, i)
            out.append((time.perf_counter() - t0) * 1e3)
        return Probed(out)

    def close(self) -> None:
        self._master.lam.close()


class LambdaSwap:
    """A :class:`serving.deploy.promise.Swap` on Lambda (see the module docstring)."""

    def __init__(self, name: str, lg: LayerGraph, request: PlanRequest, *, source: str, token: str | None = None,
                 drain_s: float = 10.0, progress: Any = None) -> None:
        self.name = name
        self.lg = lg
        self.request = request
        self.source = source
        self.token = token
        self.drain_s = drain_s
        self.progress = progress or (lambda _m: None)

    def __call__(self, result: SolverResult, round_no: int) -> None:
        import dataclasses

        from functions.plan import Plan
        from serving.deploy.aws_lambda import LambdaDeployer, LambdaDeployment
        from serving.deploy.lambda_service import LambdaService, render_lambda_service
        from serving.deploy.state import DeploymentRecord, state_dir

        record = DeploymentRecord.load(self.name)
        deployment = f"{self.name}-r{round_no}"
        bundle = export_round(self.name, self.lg, self.request, result, round_no, source=self.source,
                              progress=self.progress)
        old = LambdaService.load(record.options["rendered"])
        options = dataclasses.replace(old.options, api_token=self.token)
        service = render_lambda_service(bundle, state_dir() / "lambda" / deployment, deployment=deployment,
                                        options=options, model_name=old.model)
        dep = LambdaDeployment.from_json(dict(record.options["cloud"]))
        master = _Master(record, self.lg.model, token=self.token)
        try:
            def warm(function: str, version: str) -> None:
                for i in range(_WARM_REQUESTS):
                    master.invoke(function, version, i)

            deployer = LambdaDeployer(region=dep.region, endpoint_url=dep.endpoint_url, progress=self.progress)
            now = deployer.swap(dep, service, warm=warm, drain_s=self.drain_s)
        finally:
            master.lam.close()
        record = DeploymentRecord.load(self.name)
        record.bundle = str(bundle)
        record.functions = [f.to_json() for f in Plan.load(bundle / "plan.json").functions]
        record.predicted = dict(Plan.load(bundle / "plan.json").predicted)
        record.options["cloud"] = now.to_json()
        record.options["rendered"] = str(service.root)
        record.options["generation"] = int(record.options.get("generation", 0)) + 1
        record.save()

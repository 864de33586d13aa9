"""The IAM policies of a Lambda deployment: least privilege, written once for both deploy paths.

A deployment has two roles. The master's may invoke exactly its own worker functions (any version or
alias of them) and nothing else; every role may write only its own functions' log groups and read or
write only its own objects in the deployment's bucket (the bundle files under ``bundles/<deployment>/``,
the tensors under ``flatpack/<deployment>/``). The statements are built through an :class:`ArnBuilder`:
:func:`cfn_arn` writes CloudFormation (``Fn::Join`` over ``Ref: AWS::Partition/AWS::Region/AWS::AccountId``:
the Serverless Framework resolves ``${aws:accountId}`` over the network, these need none), and
:func:`concrete_arn` writes the strings the boto3 deployer puts straight into IAM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from serving.deploy.render import CloudFunction

__all__ = [
    "ArnBuilder",
    "LAMBDA_TRUST_POLICY",
    "bundle_prefix",
    "cfn_arn",
    "concrete_arn",
    "role_policy",
    "tensor_prefix",
]

#: service, resource segments (strings, or CloudFormation intrinsics for cfn_arn), regional, in-account
ArnBuilder = Callable[..., Any]

LAMBDA_TRUST_POLICY: dict[str, Any] = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}],
}


def bundle_prefix(deployment: str) -> str:
    """Where a deployment's bundle files live in its bucket (when they do not fit the package)."""
    return f"bundles/{deployment}"


def tensor_prefix(deployment: str) -> str:
    """Where the s3 transport stores a deployment's tensors (``S3Transport``'s default prefix + id)."""
    return f"flatpack/{deployment}"


def cfn_arn(service: str, *resource: Any, regional: bool = True, account: bool = True) -> dict[str, Any]:
    """An ARN as CloudFormation: ``Fn::Join`` of the pseudo parameters and ``resource`` segments."""
    parts: list[Any] = ["arn:", {"Ref": "AWS::Partition"}, f":{service}:"]
    if regional:
        parts.append({"Ref": "AWS::Region"})
    parts.append(":")
    if account:
        parts.append({"Ref": "AWS::AccountId"})
    parts.append(":")
    parts.extend(resource)
    merged: list[Any] = []
    for p in parts:  # adjacent strings merged: shorter templates, same value
        if isinstance(p, str) and merged and isinstance(merged[-1], str):
            merged[-1] += p
        else:
            merged.append(p)
    return {"Fn::Join": ["", merged]}


def concrete_arn(partition: str, region: str, account_id: str) -> ArnBuilder:
    """An ArnBuilder of plain strings for one account and region."""

    def build(service: str, *resource: Any, regional: bool = True, account: bool = True) -> str:
        if not all(isinstance(r, str) for r in resource):
            raise TypeError(f"concrete ARNs take string segments, got {resource!r}")
        return (f"arn:{partition}:{service}:{region if regional else ''}:{account_id if account else ''}:"
                + "".join(resource))

    return build


def _log_groups(arn: ArnBuilder, names: Sequence[str]) -> list[Any]:
    out = []
    for n in names:
        out.append(arn("logs", f"log-group:/aws/lambda/{n}"))
        out.append(arn("logs", f"log-group:/aws/lambda/{n}:*"))
    return out


def role_policy(role: str, functions: Sequence[CloudFunction], *, deployment: str, arn: ArnBuilder,
                bucket: Any = None, bundle_in_s3: bool = False, tensors_in_s3: bool = False) -> dict[str, Any]:
    """The inline policy of the ``role`` (``master`` or ``worker``) role of a deployment.

    ``bucket``: the deployment bucket's name (a string, or a CloudFormation ``Ref``); ``bundle_in_s3``:
    some bundle files are fetched from it; ``tensors_in_s3``: the s3 transport (or fallback) is used.
    """
    mine = [f for f in functions if f.role == role]
    if not mine:
        raise ValueError(f"deployment {deployment} has no {role} function")
    statements: list[dict[str, Any]] = [{
        "Sid": "OwnLogs",
        "Effect": "Allow",
        "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
        "Resource": _log_groups(arn, [f.name for f in mine]),
    }]
    if role == "master":
        workers = [f.name for f in functions if f.role == "worker"]
        if workers:
            resources = []
            for w in workers:
                resources.append(arn("lambda", f"function:{w}"))
                resources.append(arn("lambda", f"function:{w}:*"))
            statements.append({"Sid": "InvokeOwnWorkers", "Effect": "Allow", "Action": "lambda:InvokeFunction",
                               "Resource": resources})
    if bucket is not None and bundle_in_s3:
        statements.append({"Sid": "ReadOwnBundle", "Effect": "Allow", "Action": "s3:GetObject",
                           "Resource": arn("s3", bucket, f"/{bundle_prefix(deployment)}/*", regional=False,
                                           account=False)})
    if bucket is not None and tensors_in_s3:
        statements.append({"Sid": "OwnTensors", "Effect": "Allow",
                           "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                           "Resource": arn("s3", bucket, f"/{tensor_prefix(deployment)}/*", regional=False,
                                           account=False)})
    if bucket is not None and (bundle_in_s3 or tensors_in_s3):
        # listing only under the deployment's own prefixes: a missing key then reads as 404, not 403
        prefixes = [f"{p}/*" for p, used in ((bundle_prefix(deployment), bundle_in_s3),
                                              (tensor_prefix(deployment), tensors_in_s3)) if used]
        statements.append({"Sid": "ListOwnPrefixes", "Effect": "Allow", "Action": "s3:ListBucket",
                           "Resource": arn("s3", bucket, regional=False, account=False),
                           "Condition": {"StringLike": {"s3:prefix": prefixes}}})
    return {"Version": "2012-10-17", "Statement": statements}

"""S3 transport: one object per tensor, ``<prefix><deployment>/<request>/<tensor>``, via boto3.

The bucket and its lifecycle rule (expire ``<prefix>`` objects after a day: the TTL backstop) are the
deployer's job. Objects are deleted after they are read. A discarded request (:meth:`Transport.discard`)
is marked by an empty object ``<prefix>.discarded/<deployment>/<request>``, which every put looks for
(a HEAD) after storing its tensor. ``endpoint_url`` points the client at another
S3 (moto's server in the tests, MinIO on OpenFaaS).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from functions.codec import Compression, decode, encode_parts
from functions.errors import TransportError
from functions.transport.base import TensorKey, Transport

__all__ = ["S3Transport"]


class S3Transport(Transport):
    """Tensors as S3 objects.

    Parameters
    ----------
    bucket: the bucket (must exist).
    endpoint_url: S3 endpoint override (None: AWS).
    region: the bucket's region.
    prefix: key prefix of every tensor object.
    client: a ready boto3 S3 client (the other connection arguments are then ignored).
    max_connections: HTTP connection pool size (concurrent puts/gets from one function).
    """

    scheme = "s3"

    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        prefix: str = "flatpack/",
        client: Any = None,
        max_connections: int = 32,
    ) -> None:
        try:
            import boto3
            import botocore.config
            import botocore.exceptions
        except ImportError as e:
            raise TransportError("the s3 transport needs boto3: pip install 'flatpack[aws]'") from e
        self.bucket = bucket
        self._prefix = prefix
        self._where = f"s3://{bucket}" + (f" at {endpoint_url}" if endpoint_url else "")
        self._client = client or boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region,
            config=botocore.config.Config(
                max_pool_connections=max_connections,
                connect_timeout=2,
                read_timeout=30,
                retries={"max_attempts": 2, "mode": "standard"},
            ),
        )
        self._client_error = botocore.exceptions.ClientError
        self._errors = (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError)

    def _name(self, key: TensorKey) -> str:
        return f"{self._prefix}{key.deployment}/{key.request_id}/{key.name}"

    def _fail(self, what: str, e: BaseException) -> TransportError:
        return TransportError(f"cannot {what} in {self._where}: {e}")

    def put(self, key: TensorKey, array: np.ndarray, *, compression: Compression = "none") -> str:
        head, payload = encode_parts(array, compression)
        name = self._name(key)
        try:
            self._client.put_object(Bucket=self.bucket, Key=name, Body=b"".join((head, payload)))
        except self._errors as e:
            raise self._fail(f"store tensor {key}", e) from e
        if self._exists(self._mark(key.deployment, key.request_id)):
            self._delete_names([name])  # see Transport.discard
        return self.ref(key)

    def _mark(self, deployment: str, request_id: str) -> str:
        # outside every deployment's prefix, so counts and purges of tensors never see it
        return f"{self._prefix}.discarded/{deployment}/{request_id}"

    def _mark_discarded(self, deployment: str, request_id: str) -> None:
        try:
            self._client.put_object(Bucket=self.bucket, Key=self._mark(deployment, request_id), Body=b"")
        except self._errors as e:
            raise self._fail(f"mark request {request_id} discarded", e) from e

    def _exists(self, name: str) -> bool:
        try:
            self._client.head_object(Bucket=self.bucket, Key=name)
        except self._client_error as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return False
            raise self._fail(f"look for {name}", e) from e
        except self._errors as e:
            raise self._fail(f"look for {name}", e) from e
        return True

    def get(self, ref: str, *, delete: bool = False) -> np.ndarray:
        name = self._name(self.key_of(ref))
        try:
            data = self._client.get_object(Bucket=self.bucket, Key=name)["Body"].read()
        except self._client_error as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise TransportError(f"tensor {ref} is not in {self._where} (key {name}): expired or deleted") from e
            raise self._fail(f"fetch tensor {ref}", e) from e
        except self._errors as e:
            raise self._fail(f"fetch tensor {ref}", e) from e
        if delete:
            self._delete_names([name])
        try:
            return decode(data)
        except ValueError as e:
            raise TransportError(f"S3 object {name} does not hold a flatpack tensor: {e}") from e

    def _delete_names(self, names: list[str]) -> None:
        if len(names) == 1:
            try:
                self._client.delete_object(Bucket=self.bucket, Key=names[0])
            except self._errors as e:
                raise self._fail("delete a tensor", e) from e
            return
        for i in range(0, len(names), 1000):
            batch = [{"Key": n} for n in names[i : i + 1000]]
            try:
                self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            except self._errors as e:
                raise self._fail("delete tensors", e) from e

    def delete(self, refs: Iterable[str]) -> None:
        names = [self._name(self.key_of(r)) for r in refs]
        if names:
            self._delete_names(names)

    def _list(self, prefix: str) -> list[str]:
        names: list[str] = []
        try:
            for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                names += [o["Key"] for o in page.get("Contents", ())]
        except self._errors as e:
            raise self._fail("list tensors", e) from e
        return names

    def purge(self, deployment: str, request_id: str | None = None) -> int:
        prefix = f"{self._prefix}{deployment}/" + (f"{request_id}/" if request_id else "")
        names = self._list(prefix)
        if names:
            self._delete_names(names)
        return len(names)

    def count(self, deployment: str) -> int:
        return len(self._list(f"{self._prefix}{deployment}/"))

    def close(self) -> None:
        self._client.close()

"""What a load is sent to: anything that answers inference requests and can read its deployment's meter."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

__all__ = ["DeploymentTarget", "EndpointTarget", "InProcessTarget", "Target"]


class Target(Protocol):
    """Something that answers inference requests and can read its deployment's meter."""

    name: str

    def infer(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]: ...

    def usage(self) -> dict[str, dict[str, Any]]:
        """Cumulative meter rows of this deployment's functions, keyed by plan function name."""
        ...

    def close(self) -> None: ...


def _rows(meter: Mapping[str, Any], prefix: str) -> dict[str, dict[str, Any]]:
    rows = meter.get("functions", {})
    return {k.removeprefix(prefix): dict(v) for k, v in rows.items() if k.startswith(prefix)}


class EndpointTarget:
    """A deployment made by `flatpack deploy`: OIP v2 requests to its endpoint, usage from its platform."""

    def __init__(self, endpoint: str, model: str, *, platform_url: str | None, deployment_id: str | None,
                 timeout_s: float = 120.0) -> None:
        self.endpoint = endpoint
        self.name = model
        self.platform_url = platform_url
        self.deployment_id = deployment_id
        self.timeout_s = timeout_s

    @classmethod
    def from_record(cls, name: str, *, timeout_s: float = 120.0) -> tuple[EndpointTarget, Path]:
        """The target for deployment ``name`` and its bundle directory; LookupError if it is not running."""
        from serving.deploy.state import DeploymentRecord

        r = DeploymentRecord.load(name)
        if not r.alive() or not r.endpoint:
            raise LookupError(f"deployment {name!r} is not running (status {r.status}); deploy it again with "
                              f"`flatpack deploy MODEL --name {name} --detach`")
        return cls(r.endpoint, r.name, platform_url=r.platform_url, deployment_id=r.deployment_id,
                   timeout_s=timeout_s), Path(r.bundle)

    def infer(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        from serving.api.client import infer_http

        return infer_http(self.endpoint, self.name, dict(inputs), timeout_s=self.timeout_s)

    def usage(self) -> dict[str, dict[str, Any]]:
        if not self.platform_url or not self.deployment_id:
            return {}
        from serving.platform.client import PlatformClient

        return _rows(PlatformClient(self.platform_url).meter(), f"{self.deployment_id}-")

    def close(self) -> None:
        pass


class DeploymentTarget:
    """A :class:`serving.platform.deploy.Deployment` on a platform, called through its master directly.
    ``keep_timings``: keep the master's timings of every request answered (:attr:`timings`)."""

    def __init__(self, deployment: Any, platform_url: str, *, name: str = "", timeout_s: float = 120.0,
                 keep_timings: bool = False) -> None:
        from serving.platform.client import PlatformClient
        from serving.platform.master_client import MasterClient

        self.deployment = deployment
        self.name = name or deployment.id
        self._client = MasterClient(deployment, platform_url, timeout_s=timeout_s)
        self._platform = PlatformClient(platform_url)
        self.keep_timings = keep_timings
        self.timings: list[dict[str, float]] = []

    def infer(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        if not self.keep_timings:
            return self._client.infer(inputs)
        outputs, timings = self._client.infer_timed(inputs)
        self.timings.append(timings)
        return outputs

    def usage(self) -> dict[str, dict[str, Any]]:
        return _rows(self._platform.meter(), f"{self.deployment.id}-")

    def close(self) -> None:
        self._client.close()


class InProcessTarget:
    """A model run in this process by onnxruntime with ``threads`` intra-op threads (a function's session
    options), no platform between: each request's run time is kept as a master's stage time would be
    (``timings``: ``stage0_ms``), and it has no meter (:meth:`usage` is empty). A same-run reference for a model
    no function of one vCPU can hold (gigabytes of embedding tables): timed between a comparison's requests,
    it follows the machine's speed as they do."""

    def __init__(self, model: str | Path, *, name: str = "in-process", threads: int = 1) -> None:
        from functions.session import make_session

        self.name = name
        self._session: Any = make_session(model, intra_op_threads=threads)
        self._outputs = [o.name for o in self._session.get_outputs()]
        self.timings: list[dict[str, float]] = []

    def infer(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        if self._session is None:
            raise RuntimeError(f"{self.name}: closed")
        t0 = time.perf_counter()
        out = self._session.run(self._outputs, dict(inputs))
        self.timings.append({"stage0_ms": 1e3 * (time.perf_counter() - t0)})
        return dict(zip(self._outputs, out, strict=True))

    def usage(self) -> dict[str, dict[str, Any]]:
        return {}

    def close(self) -> None:
        self._session = None

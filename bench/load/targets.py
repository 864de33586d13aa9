"""What a load is sent to: anything that answers inference requests and can read its deployment's meter."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

__all__ = ["DeploymentTarget", "EndpointTarget", "InProcessChainTarget", "InProcessTarget", "Target"]


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
        from functions.session import make_session, map_weights

        self.name = name
        self._session: Any = make_session(model, intra_op_threads=threads)
        map_weights(model)  # as a function's warm-up does: its tables' pages not faulted in by the requests
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


class InProcessChainTarget:
    """A model cut into a chain of parts, each run in turn in this process by onnxruntime at ``threads``
    intra-op threads, every tensor a later part reads taken from what the request and the parts before gave:
    each request's time in each part is kept (``timings``: ``part0_ms``, ``part1_ms``, ... and their sum as
    ``stage0_ms``), and it has no meter. Timed between a comparison's requests, it says where in the model a
    request's time goes as the rounds run it (an embedding lookup reading rows cold, say), which a unit
    profile, timed in a loop on one input, cannot. ``parts``: ONNX files in the model's order, reading the
    request's inputs and each other's outputs by name; the answer is the last part's outputs. Each request
    also runs a one-node session, timed as ``noop_ms``: what a part's time holds beyond its units', in the
    same rounds."""

    def __init__(self, parts: Sequence[str | Path], *, name: str = "in-process-chain", threads: int = 1) -> None:
        from functions.session import make_session, map_weights

        if not parts:
            raise ValueError(f"{name}: a chain needs at least one part")
        self.name = name
        self._sessions: list[Any] | None = [make_session(p, intra_op_threads=threads) for p in parts]
        for p in parts:
            map_weights(p)
        self._io = [([i.name for i in s.get_inputs()], [o.name for o in s.get_outputs()]) for s in self._sessions]
        self._noop: Any = make_session(_noop_model(), intra_op_threads=threads)
        self.timings: list[dict[str, float]] = []

    def infer(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        if self._sessions is None:
            raise RuntimeError(f"{self.name}: closed")
        tensors = dict(inputs)
        row: dict[str, float] = {}
        out: list[Any] = []
        for k, (session, (ins, outs)) in enumerate(zip(self._sessions, self._io, strict=True)):
            missing = [x for x in ins if x not in tensors]
            if missing:
                raise ValueError(f"{self.name}: part {k} reads {missing}, which neither the request nor an "
                                 "earlier part gives")
            t0 = time.perf_counter()
            out = session.run(outs, {x: tensors[x] for x in ins})
            row[f"part{k}_ms"] = 1e3 * (time.perf_counter() - t0)
            tensors.update(zip(outs, out, strict=True))
        row["stage0_ms"] = sum(row.values())
        x = np.zeros((1, 4), np.float32)
        t0 = time.perf_counter()
        self._noop.run(None, {"x": x})
        row["noop_ms"] = 1e3 * (time.perf_counter() - t0)
        self.timings.append(row)
        return dict(zip(self._io[-1][1], out, strict=True))

    def usage(self) -> dict[str, dict[str, Any]]:
        return {}

    def close(self) -> None:
        self._sessions = self._noop = None


def _noop_model() -> bytes:
    """A one-node ONNX model (``y = relu(x)``, x of shape 1x4): a session run with nothing to compute."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "noop", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()

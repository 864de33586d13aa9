"""The plan: what the offline side hands to the functions (serialised as plan.json in a bundle).

A plan is an ordered list of stages. Each stage covers a range of layer-graph units and is cut into
parts by one split family; each part is one ONNX file that some function runs on *regions* of the
stage's input tensors and that produces a region of (or, for reduction splits, a partial sum of) the
stage's joined tensor. The master slices, invokes, joins, and runs the optional epilogue.

Regions are boxes in the coordinates of the whole tensor: one ``(start, stop)`` pair per axis.
This module is shared by both sides (the partitioner writes plans, the functions read them) and
depends on the standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "FAMILIES",
    "JOIN_KINDS",
    "SCHEMA",
    "Family",
    "Function",
    "JoinKind",
    "ModelInfo",
    "Part",
    "PartInput",
    "Plan",
    "PlanError",
    "Region",
    "Split",
    "Stage",
    "TensorSpec",
    "full_region",
    "region_shape",
    "split_family",
]

SCHEMA = "flatpack.plan/1"

Region = tuple[tuple[int, int], ...]
Family = Literal["none", "spatial", "channel", "reduction", "heads", "embedding"]
JoinKind = Literal["none", "place", "sum"]
FAMILIES: tuple[Family, ...] = ("none", "spatial", "channel", "reduction", "heads", "embedding")
JOIN_KINDS: tuple[JoinKind, ...] = ("none", "place", "sum")


class PlanError(ValueError):
    """A plan that is malformed or does not match its schema."""


def split_family(name: str) -> Family:
    """``name`` as a split family; PlanError naming the families if it is not one."""
    if name not in FAMILIES:
        raise PlanError(f"unknown split family {name!r}; expected one of {', '.join(FAMILIES)}")
    return name


def full_region(shape: tuple[int, ...]) -> Region:
    return tuple((0, int(d)) for d in shape)


def region_shape(region: Region) -> tuple[int, ...]:
    return tuple(b - a for a, b in region)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name, e.g. "float32"
    shape: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TensorSpec:
        return cls(str(d["name"]), str(d["dtype"]), tuple(int(x) for x in d["shape"]))


@dataclass(frozen=True)
class PartInput:
    """A part reads ``region`` of tensor ``name``; inside the part file the input has the same name."""

    name: str
    region: Region

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "region": [list(r) for r in self.region]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PartInput:
        return cls(str(d["name"]), _region(d["region"]))


@dataclass(frozen=True)
class Part:
    """One ONNX file run by one function.

    ``outputs`` are the part file's output names. For a split stage there is exactly one, and
    ``output_region`` says where it goes in the stage's joined tensor (for a ``sum`` join the region is
    the whole tensor and the part's output is a partial sum). For an unsplit stage ``output_region`` is
    None and the outputs are whole tensors.
    """

    index: int
    function: str
    file: str
    inputs: tuple[PartInput, ...]
    outputs: tuple[str, ...]
    output_region: Region | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "function": self.function,
            "file": self.file,
            "inputs": [i.to_json() for i in self.inputs],
            "outputs": list(self.outputs),
            "output_region": None if self.output_region is None else [list(r) for r in self.output_region],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Part:
        region = d.get("output_region")
        return cls(
            index=int(d["index"]),
            function=str(d["function"]),
            file=str(d["file"]),
            inputs=tuple(PartInput.from_json(i) for i in d["inputs"]),
            outputs=tuple(str(o) for o in d["outputs"]),
            output_region=None if region is None else _region(region),
        )


@dataclass(frozen=True)
class Split:
    """How a stage is cut: ``family`` and its ``grid`` ((gh, gw) for spatial, (n,) otherwise)."""

    family: Family = "none"
    grid: tuple[int, ...] = (1,)

    @property
    def degree(self) -> int:
        n = 1
        for g in self.grid:
            n *= g
        return n

    def __str__(self) -> str:
        if self.family == "none":
            return "none"
        return f"{self.family}={'x'.join(str(g) for g in self.grid)}"

    def to_json(self) -> dict[str, Any]:
        return {"family": self.family, "grid": list(self.grid)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Split:
        return cls(split_family(str(d["family"])), tuple(int(g) for g in d["grid"]))


@dataclass(frozen=True)
class Stage:
    """Units ``units[0]..units[1]`` (inclusive) of the layer graph, run as ``parts`` and joined.

    ``inputs`` are the tensors the stage reads (earlier stage outputs or model inputs), ``outputs`` the
    tensors it leaves for later stages or as model outputs. ``joined`` is the tensor the join builds
    (``place``: tiles/channels into a tensor of that shape; ``sum``: partial sums added). When an
    ``epilogue`` file is given, it runs on the joined tensor (plus any stage inputs it names) and
    produces ``outputs``; otherwise ``joined`` is the stage's single output.
    """

    index: int
    units: tuple[int, int]
    split: Split
    inputs: tuple[str, ...]
    outputs: tuple[TensorSpec, ...]
    parts: tuple[Part, ...]
    join: JoinKind = "none"
    joined: TensorSpec | None = None
    epilogue: str | None = None
    codec: str = "raw"

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "units": list(self.units),
            "split": self.split.to_json(),
            "inputs": list(self.inputs),
            "outputs": [o.to_json() for o in self.outputs],
            "parts": [p.to_json() for p in self.parts],
            "join": self.join,
            "joined": None if self.joined is None else self.joined.to_json(),
            "epilogue": self.epilogue,
            "codec": self.codec,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Stage:
        join = str(d.get("join", "none"))
        if join not in JOIN_KINDS:
            raise PlanError(f"unknown join {join!r} in stage {d.get('index')}")
        joined = d.get("joined")
        return cls(
            index=int(d["index"]),
            units=(int(d["units"][0]), int(d["units"][1])),
            split=Split.from_json(d["split"]),
            inputs=tuple(str(i) for i in d["inputs"]),
            outputs=tuple(TensorSpec.from_json(o) for o in d["outputs"]),
            parts=tuple(Part.from_json(p) for p in d["parts"]),
            join=join,
            joined=None if joined is None else TensorSpec.from_json(joined),
            epilogue=d.get("epilogue"),
            codec=str(d.get("codec", "raw")),
        )


@dataclass(frozen=True)
class Function:
    name: str
    memory_mb: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "memory_mb": self.memory_mb}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Function:
        return cls(str(d["name"]), int(d["memory_mb"]))


@dataclass(frozen=True)
class ModelInfo:
    """The served model: its source's hash and its tensors with the static shapes the parts were cut for.

    ``dims`` names the symbolic input dimensions of the source model and the sizes they were fixed to
    (``--dim seq=128``; empty when the source's inputs were static): a request must have exactly ``inputs``'
    shapes, and the endpoint's model metadata reports them.
    """

    name: str
    sha256: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    dims: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "sha256": self.sha256,
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
            "dims": dict(self.dims),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ModelInfo:
        return cls(
            str(d["name"]),
            str(d["sha256"]),
            tuple(TensorSpec.from_json(t) for t in d["inputs"]),
            tuple(TensorSpec.from_json(t) for t in d["outputs"]),
            {str(k): int(v) for k, v in (d.get("dims") or {}).items()},
        )


@dataclass(frozen=True)
class Plan:
    """A whole plan. ``predicted`` holds the performance model's figures (free-form, JSON-safe)."""

    model: ModelInfo
    functions: tuple[Function, ...]
    stages: tuple[Stage, ...]
    platform: str = "local"
    transport: str = "inline"
    mode: str = "manual"
    predicted: Mapping[str, Any] = field(default_factory=dict)

    @property
    def master(self) -> str:
        return self.functions[0].name

    def function(self, name: str) -> Function:
        for f in self.functions:
            if f.name == name:
                return f
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "model": self.model.to_json(),
            "platform": self.platform,
            "transport": self.transport,
            "mode": self.mode,
            "functions": [f.to_json() for f in self.functions],
            "stages": [s.to_json() for s in self.stages],
            "predicted": dict(self.predicted),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Plan:
        schema = d.get("schema")
        if schema != SCHEMA:
            raise PlanError(f"plan schema is {schema!r}, this flatpack reads {SCHEMA!r}; re-export the bundle")
        try:
            plan = cls(
                model=ModelInfo.from_json(d["model"]),
                functions=tuple(Function.from_json(f) for f in d["functions"]),
                stages=tuple(Stage.from_json(s) for s in d["stages"]),
                platform=str(d.get("platform", "local")),
                transport=str(d.get("transport", "inline")),
                mode=str(d.get("mode", "manual")),
                predicted=dict(d.get("predicted") or {}),
            )
        except (KeyError, TypeError, IndexError) as e:
            raise PlanError(f"malformed plan: {e!r}") from e
        plan.validate()
        return plan

    def validate(self) -> None:
        """Check internal consistency: known functions, parts present, regions well formed."""
        if not self.functions:
            raise PlanError("plan has no functions")
        names = {f.name for f in self.functions}
        if len(names) != len(self.functions):
            raise PlanError("plan has duplicate function names")
        for s in self.stages:
            if not s.parts:
                raise PlanError(f"stage {s.index} has no parts")
            if s.split.family != "none" and s.joined is None:
                raise PlanError(f"stage {s.index} is split ({s.split}) but names no joined tensor")
            for p in s.parts:
                if p.function not in names:
                    raise PlanError(f"stage {s.index} part {p.index} runs on unknown function {p.function!r}")
                for r in (p.output_region or ()), *(i.region for i in p.inputs):
                    if any(a < 0 or b < a for a, b in r):
                        raise PlanError(f"stage {s.index} part {p.index} has a bad region {r}")

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.dumps() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        try:
            data = json.loads(Path(path).read_text())
        except json.JSONDecodeError as e:
            raise PlanError(f"{path} is not valid JSON: {e}") from e
        return cls.from_json(data)


def _region(raw: Any) -> Region:
    return tuple((int(a), int(b)) for a, b in raw)

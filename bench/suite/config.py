"""What the suite runs: the models of each comparison and the rounds, solver budgets and limits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["MEMORY_MB", "ModelSpec", "SuiteConfig", "label", "model_path"]

# every function of the latency comparisons: one vCPU on the local profile, one onnxruntime thread
MEMORY_MB = 1769

ModelSpec = tuple[str, int, int | None]
"""(zoo name, width divisor, input size or None)."""


@dataclass(frozen=True)
class SuiteConfig:
    """What the suite runs. Model specs are (zoo name, width divisor, input size or None)."""

    quick: bool = True
    lo_models: tuple[ModelSpec, ...] = (("vgg16", 2, 224),)
    pipeline_models: tuple[ModelSpec, ...] = (("vgg11", 2, 64),)
    slo_model: ModelSpec = ("vgg11", 4, 64)
    # MOPAR's case: a model whose layers differ in memory and time (VGG's light, slow convolutions and heavy,
    # quick classifier), large enough that slicing saves more GB-s than its extra invocation's fee
    mopar_models: tuple[ModelSpec, ...] = (("vgg16", 2, 224),)
    rounds: int = 40
    pipeline_rounds: int = 8
    mopar_rounds: int = 15
    transport_rounds: int = 20
    rl_timesteps: int = 6000
    bo_trials: int = 30
    bruteforce_s: float = 60.0
    pipeline_cap_fraction: float = 0.85
    max_group: int | None = None  # units per stage at most; None: lo's default, groups of any length (Gillis)
    slo_factor: float = 3.0  # the SLO of the cost comparison, x the fastest plan's predicted latency
    measure_budget_s: float = 60.0  # lo plans: seconds for deploying plans and timing their stages first

    @classmethod
    def full(cls) -> SuiteConfig:
        return cls(
            quick=False,
            lo_models=(("vgg11", 1, 224), ("vgg16", 1, 224), ("vgg19", 1, 224), ("wrn-50-2", 1, 224),
                       ("resnet50", 1, 224)),
            pipeline_models=(("vgg16", 1, 224), ("wrn-50-2", 1, 224)),
            slo_model=("vgg11", 2, 64),
            mopar_models=(("vgg16", 2, 224), ("vgg16", 1, 224), ("resnet50", 1, 224), ("bert", 1, None)),
            rounds=60, pipeline_rounds=15, mopar_rounds=30, transport_rounds=40,
            rl_timesteps=30_000, bo_trials=60, bruteforce_s=600.0, measure_budget_s=180.0,
        )


def label(spec: ModelSpec) -> str:
    """``vgg16/w2@224``: the model as the suite's rows name it."""
    name, wd, size = spec
    return name + (f"/w{wd}" if wd != 1 else "") + (f"@{size}" if size else "")


def model_path(spec: ModelSpec) -> Path:
    """The model's ONNX file, built once into the zoo cache."""
    from zoo.cache import zoo_file

    name, wd, size = spec
    return zoo_file(name, width_div=wd, input_size=size)

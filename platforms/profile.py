"""Platform profiles: the facts about a serverless platform that plans and the local platform need.

Profiles are data (``platforms/<name>.yaml``, beside this module), not code: memory options, how CPU is
sold (``cpu``: :class:`CpuModel`, CPU that follows memory at ``mb_per_vcpu`` or is set per function), prices,
billing granularity, payload limits, the invoke-latency distribution, bandwidth, concurrency.
Each YAML also has a ``sources`` mapping saying where each number came from. Load one with
:func:`load_profile` by name or path.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from platforms.exgauss import ExGauss

__all__ = ["CPU_MODELS", "MB", "PROFILE_DIR", "CpuModel", "CpuModelName", "MemoryRange", "PlatformProfile",
           "TransferCost", "billed_ms", "expected_billed_ms", "load_profile", "load_profile_data", "profile_names",
           "resolve_profile_path", "threads_for", "vcpus_for"]

PROFILE_DIR = Path(__file__).resolve().parent

#: bytes in a MB as every figure here counts them (memory sizes, ``bandwidth_mb_s``): a mebibyte
MB = 2**20


#: at or below this granularity (Lambda's, 1 ms) run-to-run jitter spans several billing steps
FINE_GRANULARITY_MS = 1.0


def billed_ms(duration_ms: float, granularity_ms: float) -> float:
    """What one invocation of ``duration_ms`` is billed for: its duration rounded up to the granularity, at
    least one step (Lambda's rule; a granularity of 0 bills the duration as it is). The one billing rule,
    for the platform's meter and the simulator alike."""
    g = granularity_ms
    if g <= 0:
        return max(duration_ms, 0.0)
    return max(1, math.ceil(max(duration_ms, 0.0) / g - 1e-9)) * g


def expected_billed_ms(mean_ms: float, granularity_ms: float) -> float:
    """What an invocation whose duration averages ``mean_ms`` is billed for on average under
    :func:`billed_ms` (the performance model's view, which knows means). With a granularity much coarser
    than the run-to-run jitter (Lambda's old 100 ms) every run rounds to the same step, ``billed_ms`` of the
    mean; with a fine one (1 ms) the jitter spreads the durations over several steps and rounding up adds
    half a step on average, which rounding the mean gets wrong by up to a whole step (20 % of a 5 ms
    invocation)."""
    g = granularity_ms
    if g <= 0:
        return max(mean_ms, 0.0)
    if g <= FINE_GRANULARITY_MS:
        return max(g, mean_ms + g / 2)
    return billed_ms(mean_ms, g)


def vcpus_for(memory_mb: float, mb_per_vcpu: float, max_vcpu: float | None, *, cores: int | None = None) -> float:
    """The vCPUs a function of ``memory_mb`` gets where ``mb_per_vcpu`` of memory buys one: capped by the
    platform's ``max_vcpu`` and by ``cores``, the cores of the machine it runs on when that is this one
    (the local platform; None for a cloud function, whose host is not the planning machine). A platform
    without a cap (``max_vcpu`` None, the local profile) is capped by ``cores``, else by this machine's."""
    caps = [float(c) for c in (max_vcpu, cores) if c is not None]
    cap = min(caps) if caps else float(os.cpu_count() or 1)
    return min(cap, memory_mb / mb_per_vcpu)


def threads_for(memory_mb: float, mb_per_vcpu: float, max_vcpu: float | None, *, cores: int | None = None) -> int:
    """onnxruntime intra-op threads for a function of ``memory_mb``: the ceiling of its vCPUs
    (:func:`vcpus_for`, same arguments), at least one. A 0.29 vCPU function runs one thread, a 1.45 vCPU one
    two: Lambda shows a function of more than one vCPU two CPUs, and the performance model times it with
    all of its share (Amdahl over the vCPUs), which one thread could not use.

    The one formula for every side: the planner (``PlatformProfile.threads``), each deployer's rendered
    configuration (Lambda, OpenFaaS) and the local platform's instances, so a function runs with the
    threads it was planned with."""
    return max(1, math.ceil(vcpus_for(memory_mb, mb_per_vcpu, max_vcpu, cores=cores) - 1e-9))


CpuModelName = Literal["follows_memory", "per_function"]
CPU_MODELS: tuple[CpuModelName, ...] = ("follows_memory", "per_function")


@dataclass(frozen=True)
class CpuModel:
    """How a platform sells CPU (the profile's ``cpu`` mapping).

    ``follows_memory`` (AWS Lambda): a function's CPU is its memory over the profile's ``mb_per_vcpu``,
    capped by ``max_vcpu``; nothing about CPU is set per function. ``per_function`` (OpenFaaS, Kubernetes):
    a function's CPU request and limit are its own setting, apart from its memory limit: ``default_vcpu``
    where a function sets none, within ``min_vcpu``..``max_vcpu`` (None: no cap but the machine's).
    ``price_per_vcpu_s``: USD per vCPU-second held, where the platform prices CPU apart from memory
    (0: it does not; billing is then memory x time alone).
    """

    model: CpuModelName = "follows_memory"
    default_vcpu: float | None = None
    min_vcpu: float | None = None
    max_vcpu: float | None = None
    price_per_vcpu_s: float = 0.0

    def __post_init__(self) -> None:
        if self.model not in CPU_MODELS:
            raise ValueError(f"cpu.model {self.model!r} is not one of {', '.join(CPU_MODELS)}")
        for name in ("default_vcpu", "min_vcpu", "max_vcpu"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"cpu.{name} must be positive, got {v}")
        if self.price_per_vcpu_s < 0:
            raise ValueError(f"cpu.price_per_vcpu_s must be >= 0, got {self.price_per_vcpu_s}")
        if self.model == "follows_memory":
            if self.default_vcpu is not None or self.min_vcpu is not None:
                raise ValueError("cpu.default_vcpu and cpu.min_vcpu belong to a per_function CPU model; a "
                                 "follows_memory platform's CPU is its memory over mb_per_vcpu")
            return
        if self.default_vcpu is None:
            raise ValueError("a per_function CPU model needs cpu.default_vcpu (the CPU of a function that sets none)")
        lo = self.min_vcpu if self.min_vcpu is not None else 0.0
        hi = self.max_vcpu if self.max_vcpu is not None else math.inf
        if not lo <= hi:
            raise ValueError(f"cpu.min_vcpu {lo} exceeds cpu.max_vcpu {hi}")
        if not lo <= self.default_vcpu <= hi:
            raise ValueError(f"cpu.default_vcpu {self.default_vcpu} is outside cpu.min_vcpu..cpu.max_vcpu ({lo}..{hi})")

    @property
    def per_function(self) -> bool:
        return self.model == "per_function"

    def check(self, vcpu: float) -> float:
        """``vcpu`` if a function may have it; ValueError naming the range otherwise (and for a
        follows_memory platform, where a function's CPU is not its own setting)."""
        if not self.per_function:
            raise ValueError(f"this platform's CPU follows memory: a function sets its memory, not its vCPU "
                             f"(got vcpu {vcpu})")
        lo = self.min_vcpu if self.min_vcpu is not None else 0.0
        hi = self.max_vcpu if self.max_vcpu is not None else math.inf
        if not (vcpu > 0 and lo <= vcpu <= hi):
            raise ValueError(f"vcpu {vcpu} is not offered: choose {lo:g}..{hi:g} vCPU")
        return float(vcpu)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> CpuModel:
        """The ``cpu`` mapping of a profile (absent: ``follows_memory``, the profile's ``mb_per_vcpu``)."""
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise ValueError(f"cpu must be a mapping (model: follows_memory | per_function, ...), got {d!r}")
        known = {"model", "default_vcpu", "min_vcpu", "max_vcpu", "price_per_vcpu_s"}
        unknown = sorted(set(map(str, d)) - known)
        if unknown:
            raise ValueError(f"cpu has unknown field(s) {unknown}; known: {sorted(known)}")
        if "model" not in d:
            raise ValueError(f"cpu.model is missing; choose one of {', '.join(CPU_MODELS)}")

        def num(name: str) -> float | None:
            v = d.get(name)
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f"cpu.{name} must be a number, got {v!r}")
            return float(v)

        return cls(model=_model_name(d["model"]), default_vcpu=num("default_vcpu"),
                   min_vcpu=num("min_vcpu"), max_vcpu=num("max_vcpu"),
                   price_per_vcpu_s=num("price_per_vcpu_s") or 0.0)


@dataclass(frozen=True)
class MemoryRange:
    """Memory sizes a function may have: ``min_mb`` to ``max_mb`` in steps of ``step_mb``."""

    min_mb: int
    max_mb: int
    step_mb: int = 1

    def check(self, memory_mb: int) -> None:
        if not self.min_mb <= memory_mb <= self.max_mb or (memory_mb - self.min_mb) % self.step_mb:
            raise ValueError(
                f"memory {memory_mb} MB is not offered: choose {self.min_mb}..{self.max_mb} MB in steps of "
                f"{self.step_mb} MB"
            )

    def options(self) -> range:
        return range(self.min_mb, self.max_mb + 1, self.step_mb)


@dataclass(frozen=True)
class TransferCost:
    """What one put or get through a transport costs: ``latency_ms`` plus the bytes at ``bandwidth_mb_s``
    (MiB per second, as ``bandwidth_mb_s`` everywhere in a profile). ``tensor_ms``: what each further small
    tensor costs a function that moves several one after another (a recommendation model's nine inputs),
    whose caches the first one has warmed; None: not calibrated, each costs ``latency_ms``."""

    latency_ms: float
    bandwidth_mb_s: float
    tensor_ms: float | None = None


@dataclass(frozen=True)
class PlatformProfile:
    """One platform's facts.

    ``mb_per_vcpu``: memory that buys one vCPU (CPU is proportional to memory); ``max_vcpu`` caps it
    (None: this machine's cores). ``cpu``: how the platform sells CPU (:class:`CpuModel`): where it is
    ``per_function``, a function's CPU is its own setting, not ``mb_per_vcpu``'s share
    (:meth:`function_vcpu`), and ``mb_per_vcpu`` stays the reference for figures given per memory size.
    Prices in USD. ``billing_granularity_ms``: durations are rounded up to
    a multiple of it. ``payload_limit_bytes``: synchronous invoke request/response limit.
    ``invoke_latency``: the invoke round trip (:class:`platforms.exgauss.ExGauss`, in ms).

    Optional, written by ``flatpack calibrate`` (absent from a profile that was not measured):
    ``transports``: per transport name (``shm``, ``redis``, ``inline``) the cost of one put or get;
    ``cold_start_ms``: what a cold invocation takes beyond a warm one; ``cpu_share``: per function
    memory (MB), how many times longer a fixed computation takes than at ``mb_per_vcpu`` (one vCPU);
    ``dispatch_ms``: per master memory (MB), the master's CPU per worker invocation it makes, beyond the
    transfers: the event, the invoke request, reading the reply, its share of the join (more below one
    vCPU, where the share's throttling makes each thread hand-off dearer; a single number is one vCPU's);
    ``handling_ms``: a function's
    own CPU (at one vCPU) per invocation it serves (the HTTP request, the event, the reply), which its
    share stretches where it is below one vCPU; ``stage_overhead_ms``: the master's CPU (at one vCPU) per
    stage it forks beyond what each worker adds (its bookkeeping and joining: the fork probes' CPU at no
    workers, by their line through the worker counts); ``jitter_sigma``: the lognormal sigma of a fixed
    computation's repeats in a function (the machine's speed as one request sees it; the tail model's
    request-wide factor).
    The performance model reads ``cpu_share`` (it corrects the nominal share below one vCPU), the plan's
    transport from ``transports`` (its puts and gets), ``dispatch_ms``, ``handling_ms`` and
    ``stage_overhead_ms`` (else its own defaults), but not
    ``cold_start_ms`` (the tail model takes the cold start it is given).
    """

    name: str
    memory: MemoryRange
    mb_per_vcpu: float
    max_vcpu: float | None
    price_per_gb_s: float
    price_per_request: float
    billing_granularity_ms: int
    payload_limit_bytes: int
    async_payload_limit_bytes: int
    timeout_max_s: float
    invoke_latency: ExGauss
    bandwidth_mb_s: float
    max_concurrency: int
    shared_memory: bool
    sources: Mapping[str, str] = field(default_factory=dict)
    billed_overhead_ms: float = 0.0  # billed per invocation beyond the handler's own work (hand-off, decoding)
    transports: Mapping[str, TransferCost] = field(default_factory=dict)
    cold_start_ms: float | None = None
    cpu_share: Mapping[int, float] = field(default_factory=dict)
    dispatch_ms: Mapping[int, float] = field(default_factory=dict)
    handling_ms: float | None = None
    stage_overhead_ms: float | None = None
    jitter_sigma: float = 0.0
    cpu: CpuModel = field(default_factory=CpuModel)

    def function_vcpu(self, memory_mb: float, vcpu: float | None = None, *, cores: int | None = None) -> float:
        """The vCPUs a function gets under the profile's CPU model: where CPU follows memory,
        :meth:`vcpus` of ``memory_mb`` (``vcpu`` must be None); where it is per function, ``vcpu`` checked
        against the profile's range, else its default, capped by ``cores`` where given."""
        if not self.cpu.per_function:
            if vcpu is not None:
                self.cpu.check(vcpu)  # raises: CPU is not a function's own setting here
            return self.vcpus(memory_mb, cores=cores)
        v = self.cpu.check(vcpu) if vcpu is not None else float(self.cpu.default_vcpu or 1.0)
        return min(v, float(cores)) if cores is not None else v

    def function_threads(self, memory_mb: float, vcpu: float | None = None, *, cores: int | None = None) -> int:
        """onnxruntime intra-op threads for :meth:`function_vcpu` (its ceiling, at least one)."""
        return max(1, math.ceil(self.function_vcpu(memory_mb, vcpu, cores=cores) - 1e-9))

    def vcpus(self, memory_mb: float, *, cores: int | None = None) -> float:
        """vCPUs a function of ``memory_mb`` gets (:func:`vcpus_for`: capped by the profile's ``max_vcpu``,
        and by ``cores`` or, where the profile has no cap, this machine's cores)."""
        return vcpus_for(memory_mb, self.mb_per_vcpu, self.max_vcpu, cores=cores)

    def threads(self, memory_mb: float, *, cores: int | None = None) -> int:
        """onnxruntime intra-op threads for that share (:func:`threads_for`). A cloud function's are not
        capped by the planning machine's cores: pass ``cores`` only for a function that runs here."""
        return threads_for(memory_mb, self.mb_per_vcpu, self.max_vcpu, cores=cores)

    @property
    def shared_host(self) -> bool:
        """Whether every function shares one machine's cores (the local platform: no ``max_vcpu``, the cap
        is this machine's cores), rather than each computing with CPU of its own (a cloud)."""
        return self.max_vcpu is None

    @property
    def one_vcpu_mb(self) -> int:
        """The offered memory size nearest to one vCPU (``mb_per_vcpu``), where a share stops stretching a
        thread's time: the reference size for per-memory figures given as one number."""
        m = self.memory
        k = round((self.mb_per_vcpu - m.min_mb) / m.step_mb)
        return int(min(m.max_mb, max(m.min_mb, m.min_mb + k * m.step_mb)))

    def billed_ms(self, duration_ms: float) -> float:
        """One invocation's billed duration (:func:`billed_ms`)."""
        return billed_ms(duration_ms, self.billing_granularity_ms)

    def billed_gb_s(self, memory_mb: float, duration_ms: float) -> float:
        """GB-seconds billed for one invocation: memory in GB x duration rounded up to the granularity."""
        return memory_mb / 1024 * self.billed_ms(duration_ms) / 1000

    def billed_vcpu_s(self, vcpu: float, duration_ms: float) -> float:
        """vCPU-seconds billed for one invocation where the profile prices CPU (0 where it does not)."""
        if not self.cpu.price_per_vcpu_s:
            return 0.0
        return vcpu * self.billed_ms(duration_ms) / 1000

    def cost(self, memory_mb: float, duration_ms: float, requests: int = 1, *, vcpu: float | None = None) -> float:
        """USD for ``requests`` invocations of ``duration_ms``: memory held x time, plus CPU held x time
        where the profile prices CPU (``vcpu``: the function's, else what the profile's model gives it)."""
        usd = self.billed_gb_s(memory_mb, duration_ms) * self.price_per_gb_s + requests * self.price_per_request
        if self.cpu.price_per_vcpu_s:
            v = self.function_vcpu(memory_mb, vcpu) if vcpu is not None or self.cpu.per_function else \
                self.vcpus(memory_mb)
            usd += self.billed_vcpu_s(v, duration_ms) * self.cpu.price_per_vcpu_s
        return usd

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, origin: str = "profile") -> PlatformProfile:
        try:
            mem = d["memory_mb"]
            lat = d["invoke_latency_ms"]
            return cls(
                name=str(d["name"]),
                memory=MemoryRange(int(mem["min"]), int(mem["max"]), int(mem.get("step", 1))),
                mb_per_vcpu=float(d["mb_per_vcpu"]),
                max_vcpu=None if d.get("max_vcpu") is None else float(d["max_vcpu"]),
                price_per_gb_s=float(d["price_per_gb_s"]),
                price_per_request=float(d["price_per_request"]),
                billing_granularity_ms=int(d["billing_granularity_ms"]),
                payload_limit_bytes=int(d["payload_limit_bytes"]),
                async_payload_limit_bytes=int(d.get("async_payload_limit_bytes", d["payload_limit_bytes"])),
                timeout_max_s=float(d["timeout_max_s"]),
                invoke_latency=ExGauss(float(lat["mu"]), float(lat["sigma"]), float(lat["tau"])),
                bandwidth_mb_s=float(d["bandwidth_mb_s"]),
                max_concurrency=int(d["max_concurrency"]),
                shared_memory=bool(d["shared_memory"]),
                sources={str(k): str(v) for k, v in (d.get("sources") or {}).items()},
                billed_overhead_ms=float(d.get("billed_overhead_ms", 0.0)),
                transports={str(k): TransferCost(float(v["latency_ms"]), float(v["bandwidth_mb_s"]),
                                                 float(v["tensor_ms"]) if v.get("tensor_ms") is not None else None)
                            for k, v in (d.get("transports") or {}).items()},
                cold_start_ms=None if d.get("cold_start_ms") is None else float(d["cold_start_ms"]),
                cpu_share={int(k): float(v) for k, v in (d.get("cpu_share") or {}).items()},
                dispatch_ms=_per_memory(d.get("dispatch_ms"), float(d["mb_per_vcpu"])),
                handling_ms=None if d.get("handling_ms") is None else float(d["handling_ms"]),
                stage_overhead_ms=None if d.get("stage_overhead_ms") is None else float(d["stage_overhead_ms"]),
                jitter_sigma=float(d.get("jitter_sigma") or 0.0),
                cpu=_cpu_model(d.get("cpu")),
            )
        except KeyError as e:
            raise ValueError(f"{origin}: missing field {e}") from e
        except (TypeError, ValueError) as e:
            raise ValueError(f"{origin}: {e}") from e


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def resolve_profile_path(name_or_path: str | Path) -> Path:
    """The YAML file of a profile named ``name_or_path`` (``aws-lambda``, ``openfaas``, ``local``), or the
    path itself when it ends in ``.yaml`` / ``.yml``; ValueError if there is no such file."""
    p = Path(name_or_path)
    if p.suffix not in (".yaml", ".yml"):
        p = PROFILE_DIR / f"{name_or_path}.yaml"
    if not p.is_file():
        raise ValueError(f"no platform profile {str(name_or_path)!r}; known: {profile_names()} (or give a .yaml path)")
    return p


def load_profile_data(name_or_path: str | Path) -> dict[str, Any]:
    """A profile's YAML mapping as written (for tools that rewrite some fields and keep the rest)."""
    p = resolve_profile_path(name_or_path)
    with open(p) as f:
        data = yaml.safe_load(f)
    if not isinstance(data, Mapping):
        raise ValueError(f"{p}: a platform profile is a YAML mapping")
    return dict(data)


def load_profile(name_or_path: str | Path) -> PlatformProfile:
    """A profile by name (``aws-lambda``, ``openfaas``, ``local``) or from a YAML file path."""
    return PlatformProfile.from_dict(load_profile_data(name_or_path), origin=str(resolve_profile_path(name_or_path)))


def _model_name(value: object) -> CpuModelName:
    for name in CPU_MODELS:
        if value == name:
            return name
    raise ValueError(f"cpu.model {value!r} is not one of {', '.join(CPU_MODELS)}")


def _cpu_model(value: Any) -> CpuModel:
    try:
        return CpuModel.from_dict(value)
    except ValueError as e:
        raise ValueError(f"field cpu: {e}") from e


def _per_memory(value: Any, mb_per_vcpu: float) -> dict[int, float]:
    """A figure per memory size (MB) from a mapping, or from one number (one vCPU's: ``mb_per_vcpu``)."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {int(k): float(v) for k, v in value.items()}
    return {round(mb_per_vcpu): float(value)}

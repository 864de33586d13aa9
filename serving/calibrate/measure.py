"""Measuring a platform: what the performance model takes from a platform profile.

Against a :class:`CalibrationTarget`: the local platform (:class:`LocalTarget`, behind a
:class:`serving.platform.PlatformClient`), or AWS Lambda or OpenFaaS (:mod:`serving.calibrate.cloud`).
Probe functions (:mod:`serving.calibrate.probes`) are deployed through that target's ordinary deployer
and invoked the ordinary way, so every figure includes what a real request pays:

* **invoke latency**: round trips of a warm no-op, fitted as an ex-Gaussian (Gillis's model of Lambda's);
* **billed overhead**: the platform meter's mean duration of those no-op invocations (billed beyond the
  work; the local platform's meter, Lambda's ``REPORT`` lines; not measured where there is no meter);
* **transfers**, per transport (``inline``, ``shm``, ``redis``): an echo probe at several sizes, each
  round trip paired with a no-op's; the median difference over the transfers a round makes
  (four by reference: the caller's put, the master's get, its put, the caller's get; two inline) is one
  transfer's time, fitted as ``latency + bytes / bandwidth``. Before each round this process writes a
  buffer larger than the last-level cache (``evict_bytes``): in a request, transfers follow compute that
  has evicted the caches, and back-to-back rounds would time hot ones (on this machine kind 0.057 ms per
  shm transfer hot, 0.082 ms cold, at 4 KiB);
* **tensor moves**: on the local platform, for each reference transport, a no-op moving 8 small tensors each
  way against one moving one, in turn, the caches evicted before each: what each further tensor's get or
  put adds to the function's metered time. A model with many inputs (a DLRM's nine) moves them one after
  another, the later ones with the caches the first one warmed: a fraction of a cold transfer's latency;
* **cold start**: the first round trip after the function was deployed again (its instances gone),
  beyond a warm one's;
* **dispatch**: the master's CPU per worker invocation (the event, the invoke request, reading the reply,
  its share of the join), beyond the transfers it makes: a small convolution split into 2 and into 4 tiles
  that workers run while the master only sends and joins, at one vCPU and at 512 MB (below one vCPU the
  share's throttling makes each thread hand-off dearer: 1.03 against 0.59 ms per worker, with its
  transfers, on this machine kind), interleaved; at each size the median of the
  master's CPU per request (its reply's ``stage0_cpu_ms``) grows by this per worker, with one put and one
  get per worker (the calibrated transfer latency) taken off. Measured on the local platform (a cloud's
  probes are one function each; the model keeps its default there);
* **handling**: a function's own CPU per invocation (the HTTP request, the event, the reply), the part of a
  request that its CPU share stretches: the no-op's round trip at a memory below one vCPU (512 MB) against
  the same at one vCPU, interleaved, over the stretch (``mb_per_vcpu / 512 - 1``). On the local platform
  (where the share is emulated; the model adds it to the invoke latency there);
* **CPU share**: a fixed computation's duration at each memory size against one vCPU's
  (:func:`measure_cpu_share_on`). Where the platform gives every instance a whole core the slow-down is about
  1; once it emulates the share its memory buys (M / mb_per_vcpu of a core) it is what a plan will see.

The caller decides which platform (see :mod:`serving.calibrate.target`); nothing here starts one.
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from functions.errors import TransportError
from functions.plan import TensorSpec
from partitioner.tail import ratio_of_means, trimmed_mean
from platforms import MB, ExGauss, PlatformProfile, TransferCost
from platforms.profile import vcpus_for
from serving.calibrate.fit import fit_transfer
from serving.calibrate.probes import (
    FORK_SPLITS,
    compute_model,
    echo_model,
    fork_model,
    noop_model,
    tensors_model,
    write_fork_bundle,
    write_probe_bundle,
)
from serving.platform.client import PlatformClient
from serving.platform.deploy import ConfigOverrides, Deployment, deploy_bundle, new_deployment_id
from serving.platform.master_client import MasterClient

__all__ = [
    "Calibration",
    "Dispatch",
    "dispatch_ms",
    "CalibrationSettings",
    "CalibrationTarget",
    "CpuShare",
    "LocalTarget",
    "Probe",
    "Progress",
    "TransferFit",
    "Usage",
    "calibrate_platform",
    "handling_ms",
    "jitter_sigma",
    "measure_cpu_share",
    "measure_dispatch",
    "measure_cpu_share_on",
    "measure_transfer",
]

log = logging.getLogger(__name__)

KIB = 2**10
#: what one call of the progress callback says: (phase, done, total)
Progress = Callable[[str, int, int], None]
_REFERENCE_TRANSFERS = 4  # per echo round by reference: caller put, master get, master put, caller get
_INLINE_TRANSFERS = 2  # inline: in the request, in the reply
_WARMUP = 3
_HANDLING_MB = 512  # the memory below one vCPU whose no-op round trip shows the handling CPU
_ATTEMPTS = 3  # transfer measurements taken again when load hid the bytes' time
_INLINE_HEADROOM = 64 * KIB  # message framing beside an inline tensor, under the payload limit
TRANSPORTS = ("inline", "shm", "redis")


@dataclass(frozen=True)
class CalibrationSettings:
    """How much to measure.

    ``invoke_samples``: warm no-op round trips for the invoke-latency fit. ``transfer_samples``: echo
    round trips (each paired with a no-op's) per transport and size. ``cold_starts``: functions registered
    again and invoked cold. ``cpu_samples``: compute-probe invocations per memory size. ``sizes``: tensor
    bytes the transfers are timed at (inline only those under the payload limit). ``transports``: which
    to time (redis is skipped, with the reason, if no server answers at ``redis_url``).
    ``dispatch_samples``: fork-probe requests per worker count. ``handling_samples``: no-op round trips at
    each of two memory sizes for the handling CPU.
    ``cpu_share_mb``: memory sizes whose slow-down against one vCPU (the profile's ``mb_per_vcpu``) is
    measured. ``compute_n`` x ``compute_layers``: the compute probe (n x n MatMuls). ``evict_bytes``: the
    buffer written before each transfer round to evict the caches (0: time hot rounds; the default is
    twice the 32 MiB L3 of the machine kind this was written on). ``shm_dir``: the shared-memory root for
    the shm transport (None: the function default)."""

    invoke_samples: int = 200
    transfer_samples: int = 20
    cold_starts: int = 5
    cpu_samples: int = 10
    dispatch_samples: int = 30
    handling_samples: int = 60
    sizes: tuple[int, ...] = (4 * KIB, 64 * KIB, 1 * MB, 4 * MB, 16 * MB)
    transports: tuple[str, ...] = TRANSPORTS
    redis_url: str | None = None
    # the sizes a plan may choose, from the smallest function up: below one vCPU the share's real slow-down
    # is not the nominal one at every size (a quota's period grants a small share in few, long slices);
    # above it a fractional share runs two threads under a quota that cannot keep both busy (2048, 2560
    # MB), against the two threads unthrottled (3538 MB). Sizes past the platform's vCPU cap are left out.
    cpu_share_mb: tuple[int, ...] = (128, 256, 512, 1024, 2048, 2560, 3538)
    compute_n: int = 256
    compute_layers: int = 48
    evict_bytes: int = 64 * MB
    shm_dir: Path | None = None
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("invoke_samples", "transfer_samples", "cpu_samples", "dispatch_samples", "handling_samples"):
            n = getattr(self, name)
            if n < 3:
                raise ValueError(f"{name} must be at least 3 (a median and a fit need several), got {n}")
        if self.cold_starts < 0:
            raise ValueError(f"cold_starts must be 0 or more, got {self.cold_starts}")
        unknown = sorted(set(self.transports) - set(TRANSPORTS))
        if unknown:
            raise ValueError(f"cannot calibrate transport(s) {unknown}; choose from {', '.join(TRANSPORTS)}")

    @classmethod
    def from_samples(cls, samples: int, **overrides: Any) -> CalibrationSettings:
        """Settings scaled from one figure, ``samples`` warm no-op round trips: a tenth of it per transfer
        size, a fifth per CPU-share size (3 to 40), one cold start per 40 (2 to 10)."""
        base: dict[str, Any] = {
            "invoke_samples": samples,
            "transfer_samples": max(3, samples // 10),
            "cold_starts": max(2, min(10, samples // 40)),
            # the CPU share's slow-down prices every plan below one vCPU: a ratio of two timings, each of which
            # moves with the machine's speed; 40 rounds put three calibrations within 2 % of each other on a
            # 2-core Xeon whose speed flipped between two modes (10 rounds: 8 %). At least 3, up to 40
            "cpu_samples": max(3, min(40, samples // 5)),
            # the dispatch cost is a median of a difference of two timings, each noisy at this scale: it
            # needs at least 20 requests to settle
            "dispatch_samples": max(3, min(40, max(20, samples // 5))),
            "handling_samples": max(3, min(100, max(30, samples // 2))),
        }
        base.update(overrides)
        return cls(**base)


@dataclass(frozen=True)
class TransferFit:
    """One transport: the fitted cost of one transfer, and the per-size points it was fitted to
    (bytes, ms per transfer, standard error), each the median of ``samples`` paired differences."""

    transport: str
    cost: TransferCost
    points: tuple[tuple[int, float, float], ...]  # (bytes, ms per transfer, its standard error in ms)
    samples: int
    tensors: TensorMoves | None = None  # each further tensor of several (None: not measured)

    def to_json(self) -> dict[str, Any]:
        return {"latency_ms": self.cost.latency_ms, "bandwidth_mb_s": self.cost.bandwidth_mb_s,
                "tensor_ms": self.cost.tensor_ms,
                "points": [{"bytes": b, "ms": ms, "stderr_ms": se} for b, ms, se in self.points],
                "samples_per_size": self.samples,
                "tensors": self.tensors.to_json() if self.tensors is not None else None}


@dataclass(frozen=True)
class TensorMoves:
    """A no-op that moves ``tensors`` small tensors each way against one that moves one, invoked in turn
    (each after the caches were evicted, as in a request): what each further tensor's put or get adds to the
    function's metered time (``billed_ms``, the mean over ``samples`` invocations each; None where the
    platform meters nothing) and to the round trip (``rtt_ms``: the median difference over four moves a
    tensor: the caller's put, the function's get, its put, the caller's get). ``tensor_ms``: the billed figure
    where metered, else the round trip's."""

    transport: str
    tensors: int
    billed_ms: float | None
    rtt_ms: float
    samples: int

    @property
    def tensor_ms(self) -> float:
        return self.billed_ms if self.billed_ms is not None else self.rtt_ms

    def to_json(self) -> dict[str, Any]:
        return {"tensors": self.tensors, "billed_ms": self.billed_ms, "rtt_ms": self.rtt_ms, "samples": self.samples}


@dataclass(frozen=True)
class CpuShare:
    """A fixed computation at ``memory_mb`` against the same at one vCPU (``reference_mb``), timed in the same
    rounds: the trimmed mean metered ms of each (``partitioner.tail.trimmed_mean``), their ratio with its
    relative standard error over the rounds (``ratio_se``), and what the profile's CPU-per-MB rule expects."""

    memory_mb: int
    reference_mb: int
    ms: float
    reference_ms: float
    expected_slowdown: float
    samples: int
    metered: bool = True  # False: timed by the function's handler (the platform reported no durations)
    # the spread of the computation's repeats at both sizes: the standard deviation of their log durations
    # around each size's median (the lognormal sigma of the machine's speed as one request sees it)
    jitter_sigma: float = 0.0
    ratio_se: float | None = None  # None: not known (fewer than 3 rounds)

    @property
    def measured_slowdown(self) -> float:
        return self.ms / self.reference_ms if self.reference_ms > 0 else float("nan")

    def to_json(self) -> dict[str, Any]:
        return {"memory_mb": self.memory_mb, "reference_mb": self.reference_mb, "ms": self.ms,
                "reference_ms": self.reference_ms, "expected_slowdown": self.expected_slowdown,
                "measured_slowdown": self.measured_slowdown, "samples": self.samples, "metered": self.metered,
                "jitter_sigma": self.jitter_sigma, "ratio_se": self.ratio_se}


@dataclass(frozen=True)
class Dispatch:
    """The fork probe's figures at one master memory: the master's median CPU per request (ms) with each
    worker count, the per-transfer latency taken off, and the resulting CPU per worker invocation
    (``dispatch_ms``)."""

    master_cpu_ms: dict[int, float]
    transfer_latency_ms: float
    dispatch_ms: float
    memory_mb: int
    samples: int
    transport: str

    @property
    def stage_ms(self) -> float:
        """The master's CPU per stage beyond what each worker adds: its line through the worker counts at none
        (at least 0)."""
        (n1, c1), (n2, c2) = sorted(self.master_cpu_ms.items())[:2]
        return max(0.0, c1 - n1 * (c2 - c1) / (n2 - n1))

    def to_json(self) -> dict[str, Any]:
        return {"dispatch_ms": self.dispatch_ms, "stage_ms": self.stage_ms,
                "master_cpu_ms": {str(k): v for k, v in self.master_cpu_ms.items()},
                "transfer_latency_ms": self.transfer_latency_ms, "memory_mb": self.memory_mb,
                "samples": self.samples, "transport": self.transport}


@dataclass(frozen=True)
class Handling:
    """The no-op's median round trips at ``memory_mb`` (below one vCPU) and at ``reference_mb`` (one vCPU),
    the stretch between them, and the function's CPU per invocation that explains the difference."""

    memory_mb: int
    reference_mb: int
    rtt_ms: float
    reference_rtt_ms: float
    stretch: float
    handling_ms: float
    samples: int

    def to_json(self) -> dict[str, Any]:
        return {"handling_ms": self.handling_ms, "memory_mb": self.memory_mb, "reference_mb": self.reference_mb,
                "rtt_ms": self.rtt_ms, "reference_rtt_ms": self.reference_rtt_ms, "stretch": self.stretch,
                "samples": self.samples}


@dataclass(frozen=True)
class Calibration:
    """Everything one calibration run measured, with the sample counts behind each figure."""

    platform_url: str
    platform_profile: str  # the profile the platform said it runs
    probe_mb: int
    invoke: ExGauss
    invoke_samples: int
    invoke_p50_ms: float
    invoke_p99_ms: float
    billed_overhead_ms: float | None  # None: the platform reports no metered duration (not measured)
    transfers: dict[str, TransferFit] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # what was not measured, and why
    cold_start_ms: float | None = None
    cold_init_ms: float | None = None  # the meter's instance start-up (process, imports, parts), per cold start
    cold_starts: int = 0
    cpu_share: tuple[CpuShare, ...] = ()
    seconds: float = 0.0
    target: str = "the local platform"  # what was measured, in words
    dispatch: tuple[Dispatch, ...] = ()  # per master memory; (): not measured (see skipped)
    handling: Handling | None = None  # None: not measured (see skipped)

    def to_json(self) -> dict[str, Any]:
        return {
            "platform_url": self.platform_url,
            "target": self.target,
            "platform_profile": self.platform_profile,
            "probe_mb": self.probe_mb,
            "invoke_latency_ms": {"mu": self.invoke.mu, "sigma": self.invoke.sigma, "tau": self.invoke.tau,
                                  "mean": self.invoke.mean, "p50": self.invoke_p50_ms, "p99": self.invoke_p99_ms,
                                  "samples": self.invoke_samples},
            "billed_overhead_ms": self.billed_overhead_ms,
            "transports": {k: v.to_json() for k, v in self.transfers.items()},
            "skipped": dict(self.skipped),
            "cold_start_ms": self.cold_start_ms,
            "cold_init_ms": self.cold_init_ms,
            "cold_starts": self.cold_starts,
            "cpu_share": [c.to_json() for c in self.cpu_share],
            "dispatch": [d.to_json() for d in self.dispatch],
            "handling": self.handling.to_json() if self.handling is not None else None,
            "seconds": self.seconds,
        }


@dataclass(frozen=True)
class Usage:
    """What a platform reported about a probe's invocations so far (cumulative): how many, their run
    time, cold starts and the instance start-up time they took. ``metered``: the durations are the
    platform's own meter (what it bills: the local platform's meter, Lambda's ``REPORT`` lines); False
    where they are the function's own timing of its handler (the reply's ``total_ms``), which times the
    work but says nothing of what a provider bills."""

    invocations: int = 0
    duration_ms: float = 0.0
    cold_starts: int = 0
    init_ms: float = 0.0
    metered: bool = True


class Probe(Protocol):
    """One deployed probe function (a one-part bundle run by its master)."""

    @property
    def memory_mb(self) -> int:
        """The master's memory."""

    def rtt(self) -> float:
        """One invocation with the probe's input: the round trip in ms, timed here."""

    def usage(self) -> Usage:
        """What the platform reported so far (see :class:`Usage`)."""

    def redeploy(self) -> None:
        """Deploy the function again: its instances go, so the next invocation is a cold start."""

    def close(self) -> None:
        """Remove the function (and whatever its deployment created)."""


class CalibrationTarget(Protocol):
    """Where probes run: the local platform, or a cloud through its deployer (:mod:`serving.calibrate.cloud`).

    ``url``: where it answers (named in the profile's sources); ``description``: what it is, in words;
    ``platform_profile``: the profile it says it runs ("" where it says none); ``compute_transport``: how
    the CPU-share probe's tensors move (one that costs next to nothing beside the compute)."""

    @property
    def url(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def platform_profile(self) -> str: ...

    @property
    def compute_transport(self) -> str: ...

    def unsupported(self, transport: str, profile: PlatformProfile) -> str | None:
        """Why ``transport``'s transfers cannot be timed here (None: they can)."""

    def deploy(self, bundle: Path, *, transport: str, memory_mb: int, settings: CalibrationSettings) -> Probe:
        """``bundle`` deployed as a probe whose master has ``memory_mb``."""


def _inputs(specs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {t.name: rng.standard_normal(tuple(t.shape)).astype(np.float32) for t in specs}


class _LocalProbe:
    """A probe on the local platform, called through the ordinary master client; usage from its meter."""

    def __init__(self, client: PlatformClient, url: str, bundle: Path, *, transport: str,
                 settings: CalibrationSettings, memory_mb: int) -> None:
        self.client, self.url, self.bundle, self.transport = client, url, bundle, transport
        self.settings = settings
        self.memory_mb = memory_mb
        cfg: ConfigOverrides = {}
        if settings.redis_url:
            cfg["redis_url"] = settings.redis_url
        if settings.shm_dir is not None:
            cfg["shm_dir"] = settings.shm_dir
        self._cfg = cfg
        self.dep = self._deploy(new_deployment_id("cal"))
        try:
            self.mc = MasterClient(self.dep, url, timeout_s=settings.timeout_s, retries=0)
        except BaseException:
            self.dep.remove()
            raise
        self.x = _inputs(self.dep.plan.model.inputs)

    def _deploy(self, deployment: str) -> Deployment:
        return deploy_bundle(self.client, self.bundle, transport=self.transport, deployment=deployment,
                             concurrency=1, timeout_s=self.settings.timeout_s, memory_mb={"master": self.memory_mb},
                             **self._cfg)

    def rtt(self) -> float:
        t = time.perf_counter()
        out = self.mc.infer(self.x)
        # a zero-copy get (shm) maps the file without reading it: touch the bytes, as a consumer would
        for y in out.values():
            float(np.asarray(y).sum())
        return (time.perf_counter() - t) * 1e3

    def master_timings(self) -> dict[str, float]:
        """One request; the master's timings of it (``stage0_cpu_ms``: its CPU in the first stage)."""
        _, timings = self.mc.infer_timed(self.x)
        return timings

    def redeploy(self) -> None:
        """Register the functions again: the platform stops their instances, so the next call is cold."""
        self.dep = self._deploy(self.dep.id)

    def usage(self) -> Usage:
        u = self.client.meter()["functions"].get(self.dep.master, {})
        return Usage(int(u.get("invocations", 0)), float(u.get("duration_ms", 0.0)), int(u.get("cold_starts", 0)),
                     float(u.get("init_ms", 0.0)))

    def close(self) -> None:
        self.mc.close()
        self.dep.remove()


@dataclass(frozen=True)
class LocalTarget:
    """The local platform at ``url`` (``client`` talks to it), as a calibration target."""

    client: PlatformClient
    url: str
    platform_profile: str = ""
    description: str = "the local platform"
    compute_transport: str = "shm"  # its tensors then cost next to nothing beside the compute

    def unsupported(self, transport: str, profile: PlatformProfile) -> str | None:
        if transport == "shm" and not profile.shared_memory:
            return f"profile {profile.name} says its functions share no memory (shared_memory: false)"
        return None

    def deploy(self, bundle: Path, *, transport: str, memory_mb: int, settings: CalibrationSettings) -> Probe:
        return _LocalProbe(self.client, self.url, bundle, transport=transport, settings=settings, memory_mb=memory_mb)


def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def _median_stderr(xs: Sequence[float]) -> float:
    """Standard error of the median, from the median absolute deviation (robust to the odd slow call)."""
    a = np.asarray(xs, dtype=float)
    mad = float(np.median(np.abs(a - np.median(a))))
    return 1.2533 * 1.4826 * mad / max(1.0, float(np.sqrt(a.size)))


def _inline_sizes(sizes: Sequence[int], payload_limit: int) -> list[int]:
    return [s for s in sizes if s + _INLINE_HEADROOM <= payload_limit]


def _redis_reason(url: str | None) -> str | None:
    """Why the redis transport cannot be timed at ``url`` (None: it can)."""
    if not url:
        return "no Redis URL (set FLATPACK_REDIS_URL)"
    try:
        from functions.transport.redis import RedisTransport
    except ImportError as e:
        return f"redis-py is not installed ({e}): pip install 'flatpack[redis]'"
    try:
        t = RedisTransport(url)
    except TransportError as e:
        return str(e)
    try:
        t.ping()
    except TransportError as e:
        return f"{e}; start redis-server or set FLATPACK_REDIS_URL"
    finally:
        t.close()
    return None


def _paired_rtt(evict: Callable[[], None], base: Probe, probe: Probe) -> float:
    """``probe``'s round trip less ``base``'s, each after the caches were evicted: paired, a burst of load from
    elsewhere slows both calls and drops out of their difference."""
    evict()
    b = base.rtt()
    evict()
    return probe.rtt() - b


class _CacheEvictor:
    """Writes one byte per cache line of a buffer larger than the last-level cache."""

    def __init__(self, nbytes: int) -> None:
        self._buf = np.zeros(nbytes, np.uint8) if nbytes > 0 else None

    def __call__(self) -> None:
        if self._buf is not None:
            self._buf[::64] += 1


def measure_transfer(target: CalibrationTarget, noop: Probe, transport: str, sizes: Sequence[int],
                     settings: CalibrationSettings, workdir: Path, progress: Progress | None = None) -> TransferFit:
    """One transport's fitted transfer cost (see the module docstring). If the points do not fit (time
    not growing with size: load from elsewhere hid the bytes' time), every size is measured again with
    as many samples more, up to ``_ATTEMPTS`` times, before the ValueError is raised."""
    per_round = _INLINE_TRANSFERS if transport == "inline" else _REFERENCE_TRANSFERS
    evict = _CacheEvictor(settings.evict_bytes)
    n = settings.transfer_samples
    diffs: dict[int, list[float]] = {size: [] for size in sizes}
    for attempt in range(_ATTEMPTS):
        total = len(sizes) * n
        for i, size in enumerate(sizes):
            bundle = workdir / f"echo{size}"
            if not bundle.exists():
                write_probe_bundle(bundle, echo_model(size), memory_mb=noop.memory_mb)
            probe = target.deploy(bundle, transport=transport, memory_mb=noop.memory_mb, settings=settings)
            try:
                for _ in range(_WARMUP):
                    probe.rtt()
                for k in range(n):
                    diffs[size].append(_paired_rtt(evict, noop, probe))
                    if progress:
                        again = f", again ({attempt + 1})" if attempt else ""
                        progress(f"{transport} transfers ({size // KIB} KiB{again})", i * n + k + 1, total)
            finally:
                probe.close()
        points = tuple((size, max(0.0, _median(d)) / per_round, _median_stderr(d) / per_round)
                       for size, d in diffs.items())
        try:
            cost = fit_transfer([p[0] for p in points], [p[1] for p in points], [p[2] for p in points])
        except ValueError as e:
            if attempt == _ATTEMPTS - 1:
                raise ValueError(f"{e} (after {len(diffs[sizes[0]])} samples per size)") from e
            log.warning("%s transfers: %s; measuring again", transport, e)
            continue
        return TransferFit(transport, cost, points, len(diffs[sizes[0]]))
    raise AssertionError("unreachable")


def measure_cpu_share(client: PlatformClient, url: str, settings: CalibrationSettings, workdir: Path, *,
                      mb_per_vcpu: float, memory_range: tuple[int, int], progress: Progress | None = None,
                      reference_mb: int | None = None) -> tuple[CpuShare, ...]:
    """The CPU share's real slow-down on the local platform at ``url``: see :func:`measure_cpu_share_on`.

    This is the hook for the local platform's CPU-share emulation: whatever mechanism the platform uses
    to give an instance M / mb_per_vcpu of a core shows here as a measured slow-down next to the
    expected ``mb_per_vcpu / M``; without one, both sizes run on whole cores and measure about 1."""
    return measure_cpu_share_on(LocalTarget(client, url), settings, workdir, mb_per_vcpu=mb_per_vcpu,
                                memory_range=memory_range, progress=progress, reference_mb=reference_mb)


def measure_cpu_share_on(target: CalibrationTarget, settings: CalibrationSettings, workdir: Path, *,
                         mb_per_vcpu: float, memory_range: tuple[int, int], progress: Progress | None = None,
                         reference_mb: int | None = None, max_vcpu: float | None = None) -> tuple[CpuShare, ...]:
    """A fixed computation (``compute_n`` x ``compute_layers`` MatMuls) timed at one vCPU (``mb_per_vcpu``,
    within ``memory_range``) and at each of ``cpu_share_mb``, interleaved so that both see the same
    machine load; the trimmed mean duration of each, as the platform reports it (see :class:`Usage`), and
    their ratio's standard error over the rounds (``partitioner.tail.ratio_of_means``). Above one
    vCPU a function runs as many threads as its vCPUs' ceiling (``platforms.threads_for``); sizes whose
    vCPUs would pass ``max_vcpu`` (the platform's cap, or the cores of the machine it shares) are left out:
    they would measure the cap again.

    The expected slow-down is the share's ideal against the reference's, ``min(1, v_ref) / v``: below one
    vCPU a thread stretched by its share, above it the work spread evenly over the quota.
    ``reference_mb``: compare with that size instead."""
    lo, hi = memory_range
    ref_mb = int(min(hi, max(lo, round(mb_per_vcpu) if reference_mb is None else reference_mb)))
    cap_mb = math.inf if max_vcpu is None else max_vcpu * mb_per_vcpu + 1e-6
    sizes = [int(m) for m in settings.cpu_share_mb if lo <= m <= min(hi, cap_mb) and m != ref_mb]
    if not sizes:
        return ()
    bundle = write_probe_bundle(workdir / "compute", compute_model(settings.compute_n, settings.compute_layers),
                                memory_mb=ref_mb)
    probes: dict[int, Probe] = {}
    times: dict[int, list[float]] = {m: [] for m in (ref_mb, *sizes)}
    try:
        for m in times:
            # by shared memory where there is one: the probe's tensors then cost next to nothing to move, so the
            # time is its compute (inline, a 512 x 512 probe's 1 MB each way added ~4 ms that no share stretches)
            probes[m] = target.deploy(bundle, transport=target.compute_transport, memory_mb=m, settings=settings)
            for _ in range(2):
                probes[m].rtt()
        total = settings.cpu_samples * len(times)
        done = 0
        for _ in range(settings.cpu_samples):
            for m, p in probes.items():
                before = p.usage()
                p.rtt()
                times[m].append(p.usage().duration_ms - before.duration_ms)
                done += 1
                if progress:
                    progress("CPU share (compute probe)", done, total)
        metered = all(p.usage().metered for p in probes.values())
    finally:
        for p in probes.values():
            p.close()
    ref = trimmed_mean(times[ref_mb])

    def expected(m: int) -> float:
        return min(1.0, ref_mb / mb_per_vcpu) / (m / mb_per_vcpu)

    def share(m: int) -> CpuShare:
        ratio, se = ratio_of_means(times[m], times[ref_mb])
        return CpuShare(m, ref_mb, ref * ratio, ref, expected(m), settings.cpu_samples, metered,
                        jitter_sigma(times[m], times[ref_mb]), se if math.isfinite(se) else None)

    return tuple(share(m) for m in sizes)


def jitter_sigma(*runs: Sequence[float]) -> float:
    """The standard deviation of the log durations of repeated runs, each run's taken around its own median:
    how much one fixed computation's time moves from request to request (``partitioner.tail.jitter_factor``)."""
    dev = [math.log(x / m) for xs in runs if (m := _median(xs)) > 0 for x in xs if x > 0]
    return statistics.stdev(dev) if len(dev) >= 3 else 0.0


def measure_dispatch(target: LocalTarget, settings: CalibrationSettings, workdir: Path, *, memory_mb: int,
                     transfers: dict[str, TransferFit], say: Progress) -> Dispatch:
    """The master's CPU per worker invocation on the local platform (see the module docstring): fork probes
    of 2 and 4 workers at ``memory_mb``, their requests interleaved so that both see the same machine."""
    transport = target.compute_transport
    fit = transfers.get(transport)
    latency = fit.cost.latency_ms if fit is not None else 0.0
    model = fork_model()
    probes: dict[int, _LocalProbe] = {}
    cpu: dict[int, list[float]] = {n: [] for n in FORK_SPLITS}
    try:
        for n in FORK_SPLITS:
            bundle = write_fork_bundle(workdir / f"fork{n}-{memory_mb}", model, n, memory_mb=memory_mb)
            probes[n] = _LocalProbe(target.client, target.url, bundle, transport=transport, settings=settings,
                                    memory_mb=memory_mb)
            for _ in range(_WARMUP):
                probes[n].master_timings()
        total = settings.dispatch_samples * len(probes)
        for _ in range(settings.dispatch_samples):
            for n, p in probes.items():
                cpu[n].append(float(p.master_timings()["stage0_cpu_ms"]))
                say(f"dispatch (fork probes, {memory_mb} MB)", sum(map(len, cpu.values())), total)
    finally:
        for p in probes.values():
            p.close()
    med = {n: _median(xs) for n, xs in cpu.items()}
    return Dispatch(med, latency, dispatch_ms(med, latency), memory_mb, settings.dispatch_samples, transport)


def dispatch_ms(master_cpu_ms: dict[int, float], transfer_latency_ms: float) -> float:
    """The master's CPU per worker invocation from the fork probes' median master CPU per request by worker
    count (two counts): its growth per worker, less each worker's input put and output get, which are the
    transfers' (calibrated) cost, not the dispatch's (at least 0)."""
    (n1, c1), (n2, c2) = sorted(master_cpu_ms.items())
    return max(0.0, (c2 - c1) / (n2 - n1) - 2 * transfer_latency_ms)


def handling_ms(low_rtts: Sequence[float], reference_rtts: Sequence[float], stretch: float) -> float:
    """A function's CPU per invocation from a no-op's round trips below one vCPU (``low_rtts``) and at one
    vCPU (``reference_rtts``), taken alternately: the difference of their medians over the share's
    ``stretch`` less one (at least 0)."""
    return max(0.0, (_median(low_rtts) - _median(reference_rtts)) / (stretch - 1.0))


def measure_handling(target: CalibrationTarget, noop: Probe, settings: CalibrationSettings, workdir: Path, *,
                     mb_per_vcpu: float, memory_mb: int, say: Progress) -> Handling:
    """A function's CPU per invocation (see the module docstring): ``noop`` (at one vCPU) and the same
    no-op at ``memory_mb``, their round trips interleaved so that both see the same machine."""
    bundle = write_probe_bundle(workdir / f"noop{memory_mb}", noop_model(), memory_mb=memory_mb)
    low = target.deploy(bundle, transport="inline", memory_mb=memory_mb, settings=settings)
    rtts: dict[int, list[float]] = {memory_mb: [], noop.memory_mb: []}
    try:
        for _ in range(_WARMUP):
            low.rtt()
        for i in range(settings.handling_samples):
            rtts[memory_mb].append(low.rtt())
            rtts[noop.memory_mb].append(noop.rtt())
            say("handling (no-op below one vCPU)", i + 1, settings.handling_samples)
    finally:
        low.close()
    stretch = min(1.0, noop.memory_mb / mb_per_vcpu) / min(1.0, memory_mb / mb_per_vcpu)
    low_rtts, ref_rtts = rtts[memory_mb], rtts[noop.memory_mb]
    return Handling(memory_mb, noop.memory_mb, _median(low_rtts), _median(ref_rtts), stretch,
                    handling_ms(low_rtts, ref_rtts, stretch), settings.handling_samples)


def _transfers(target: CalibrationTarget, noop: Probe, profile: PlatformProfile, settings: CalibrationSettings,
               workdir: Path, say: Progress) -> tuple[dict[str, TransferFit], dict[str, str]]:
    """Each transport's fit, and why those not fitted were not (cannot be timed there, or the fit failed)."""
    transfers: dict[str, TransferFit] = {}
    skipped: dict[str, str] = {}
    for transport in settings.transports:
        sizes = list(settings.sizes)
        reason = target.unsupported(transport, profile)
        if reason is None and transport == "inline":
            sizes = _inline_sizes(sizes, profile.payload_limit_bytes)
        elif reason is None and transport == "redis":
            reason = _redis_reason(settings.redis_url)
        if reason is not None:
            skipped[transport] = reason
            continue
        try:
            transfers[transport] = measure_transfer(target, noop, transport, sizes, settings, workdir, say)
        except ValueError as e:
            skipped[transport] = str(e)
            log.warning("%s transfers not fitted: %s", transport, e)
    return transfers, skipped


#: tensors each way in the tensor-moves probe (a recommendation model's inputs: its dense features and a
#: few sparse ones)
_MOVE_TENSORS = 8


def measure_tensor_moves(target: CalibrationTarget, transport: str, settings: CalibrationSettings, workdir: Path,
                         *, memory_mb: int, progress: Progress | None = None) -> TensorMoves:
    """What each further small tensor of several costs on ``transport`` (:class:`TensorMoves`): a no-op moving
    :data:`_MOVE_TENSORS` tensors each way against one moving one, invoked in turn
    (``settings.handling_samples`` each), the caches evicted before every call."""
    evict = _CacheEvictor(settings.evict_bytes)
    probes = []
    try:
        for k in (1, _MOVE_TENSORS):
            bundle = write_probe_bundle(workdir / f"tensors{k}-{transport}", tensors_model(k), memory_mb=memory_mb)
            probes.append(target.deploy(bundle, transport=transport, memory_mb=memory_mb, settings=settings))
        one, many = probes
        for _ in range(_WARMUP):
            one.rtt()
            many.rtt()
        before = (one.usage(), many.usage())
        diffs = []
        n = settings.handling_samples
        for i in range(n):
            diffs.append(_paired_rtt(evict, one, many))
            if progress:
                progress(f"{transport}: {_MOVE_TENSORS} tensors against one", i + 1, n)
        after = (one.usage(), many.usage())
    finally:
        for probe in probes:
            probe.close()
    extra = _MOVE_TENSORS - 1
    billed = None
    calls = [a.invocations - b.invocations for a, b in zip(after, before, strict=True)]
    if all(a.metered for a in after) and min(calls) > 0:
        mean = [(a.duration_ms - b.duration_ms) / c for a, b, c in zip(after, before, calls, strict=True)]
        billed = max(0.0, (mean[1] - mean[0]) / (2 * extra))  # the function's get and put of each
    return TensorMoves(transport, _MOVE_TENSORS, billed, max(0.0, _median(diffs)) / (4 * extra), n)


def _cold_starts(noop: Probe, n: int, say: Progress) -> tuple[list[float], float | None]:
    """``n`` cold round trips beyond a warm one's (the no-op deployed again each time), and the platform's
    mean instance start-up per cold start where it reports one."""
    extra: list[float] = []
    before = noop.usage()
    for i in range(n):
        noop.redeploy()
        cold = noop.rtt()
        warm = _median([noop.rtt() for _ in range(3)])
        extra.append(max(0.0, cold - warm))
        say("cold starts", i + 1, n)
    after = noop.usage()
    n_cold = after.cold_starts - before.cold_starts
    return extra, (after.init_ms - before.init_ms) / n_cold if n_cold > 0 else None


def _with_tensors(fit: TransferFit, target: CalibrationTarget, settings: CalibrationSettings, workdir: Path,
                  memory_mb: int, say: Progress) -> TransferFit:
    """``fit`` with its transport's :class:`TensorMoves` (inline tensors ride in the invocation: none)."""
    if fit.transport == "inline":
        return fit
    moves = measure_tensor_moves(target, fit.transport, settings, workdir, memory_mb=memory_mb, progress=say)
    return replace(fit, cost=replace(fit.cost, tensor_ms=moves.tensor_ms), tensors=moves)


def calibrate_platform(target: CalibrationTarget, profile: PlatformProfile,
                       settings: CalibrationSettings | None = None, *, progress: Progress | None = None,
                       workdir: Path | None = None) -> Calibration:
    """Measure ``target`` for ``profile``: see the module docstring. Probe functions have ``profile``'s
    one-vCPU memory (its ``mb_per_vcpu``, within its memory range) and are removed afterwards, also when a
    measurement fails. A transport that cannot be timed (no Redis answering, no shared memory on the
    target) is left out and named in ``skipped``; a fit that fails is too (with its error). Where the
    platform reports no metered duration, the billed overhead is None (not measured)."""
    settings = settings or CalibrationSettings()
    t_start = time.perf_counter()
    probe_mb = int(min(profile.memory.max_mb, max(profile.memory.min_mb, round(profile.mb_per_vcpu))))
    say = progress or (lambda _p, _d, _t: None)
    with contextlib.ExitStack() as stack:
        tmp = Path(workdir) if workdir is not None else Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="flatpack-calibrate-")))
        noop_dir = write_probe_bundle(tmp / "noop", noop_model(), memory_mb=probe_mb)
        say("deploying the no-op probe", 0, 1)
        noop = target.deploy(noop_dir, transport="inline", memory_mb=probe_mb, settings=settings)
        stack.callback(noop.close)
        for _ in range(_WARMUP):
            noop.rtt()

        # invoke latency and the billed overhead: warm round trips back to back
        before = noop.usage()
        rtts: list[float] = []
        for i in range(settings.invoke_samples):
            rtts.append(noop.rtt())
            say("invoke latency (warm no-op)", i + 1, settings.invoke_samples)
        after = noop.usage()
        invocations = after.invocations - before.invocations
        billed = ((after.duration_ms - before.duration_ms) / invocations
                  if after.metered and invocations > 0 else None)
        try:
            invoke = ExGauss.fit(rtts)
        except ValueError as e:
            raise ValueError(f"{e}; raise --samples") from e

        transfers, skipped = _transfers(target, noop, profile, settings, tmp, say)
        if isinstance(target, LocalTarget):
            transfers = {name: _with_tensors(fit, target, settings, tmp, probe_mb, say)
                         for name, fit in transfers.items()}
        cold_extra, init_ms = _cold_starts(noop, settings.cold_starts, say)
        dispatch: tuple[Dispatch, ...] = ()
        handling = None
        if isinstance(target, LocalTarget):
            low_mb = int(min(probe_mb - 1, max(profile.memory.min_mb, _HANDLING_MB)))
            sizes = (probe_mb, low_mb) if low_mb < probe_mb else (probe_mb,)
            dispatch = tuple(measure_dispatch(target, settings, tmp, memory_mb=mb, transfers=transfers, say=say)
                             for mb in sizes)
            if low_mb < probe_mb and profile.mb_per_vcpu > low_mb:
                handling = measure_handling(target, noop, settings, tmp, mb_per_vcpu=profile.mb_per_vcpu,
                                            memory_mb=low_mb, say=say)
            else:
                skipped["handling"] = f"no memory size below one vCPU ({probe_mb} MB) in profile {profile.name}"
        else:
            skipped["dispatch"] = (f"{target.description}'s probes are one function each: the master's CPU per "
                                   f"worker invocation keeps the model's default")
            skipped["handling"] = (f"{target.description}'s invoke latency already holds its functions' handling "
                                   f"at their size; the model keeps its default")
        cpu = measure_cpu_share_on(target, settings, tmp, mb_per_vcpu=profile.mb_per_vcpu,
                                   memory_range=(profile.memory.min_mb, profile.memory.max_mb), progress=say,
                                   max_vcpu=vcpus_for(profile.memory.max_mb, profile.mb_per_vcpu, profile.max_vcpu))
    rtts_sorted = np.sort(np.asarray(rtts))
    return Calibration(
        platform_url=target.url,
        platform_profile=target.platform_profile,
        probe_mb=probe_mb,
        invoke=invoke,
        invoke_samples=len(rtts),
        invoke_p50_ms=float(np.percentile(rtts_sorted, 50)),
        invoke_p99_ms=float(np.percentile(rtts_sorted, 99)),
        billed_overhead_ms=billed,
        transfers=transfers,
        skipped=skipped,
        cold_start_ms=_median(cold_extra) if cold_extra else None,
        cold_init_ms=init_ms,
        cold_starts=len(cold_extra),
        cpu_share=cpu,
        dispatch=dispatch,
        handling=handling,
        seconds=time.perf_counter() - t_start,
        target=target.description,
    )

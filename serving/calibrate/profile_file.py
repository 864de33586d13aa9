"""A calibrated platform profile on disk: the base profile with its measured fields replaced.

The file has the schema of ``platforms/*.yaml`` (``platforms.load_profile`` reads it, ``--platform FILE``
takes it): the base profile's mapping as written, with the fields a calibration measured replaced and
their ``sources`` saying so (measured by whom, on which host, when, with which flatpack, from how many
samples). Fields it did not measure keep the base profile's value and source.

Per machine, calibrations are cached under ``$FLATPACK_CACHE_DIR/platforms/<profile>-<host>-<machine>.yaml``
(:func:`calibrated_profile_path`; ``<machine>`` is the unit profile cache's key of this machine: its CPU model,
cores, onnxruntime and machine id); :func:`calibrated_profile` reads that cache.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import yaml

from functions import settings
from platforms import PlatformProfile, load_profile, load_profile_data, resolve_profile_path
from serving.calibrate.measure import Calibration
from serving.calibrate.provenance import Provenance

__all__ = ["calibrated_profile_data", "calibrated_profile_path", "write_profile"]

_ROUND = 4  # decimals kept of a measured ms or MB/s figure


def calibrated_profile_path(name: str, *, host: str | None = None, cache_dir: Path | None = None) -> Path:
    """Where this machine's calibration of profile ``name`` is cached:
    ``<cache_dir>/platforms/<name>-<host>.yaml`` (``cache_dir`` defaults to ``$FLATPACK_CACHE_DIR``). ``host``
    (a cloud's endpoint or region) as given; by default this machine's host name and its key in the unit
    profile's cache (``partitioner.profile.cache.machine_info``): a cache directory carried to a clone of this
    VM on a host with another CPU, whose host name and machine id are the same, is calibrated there again."""
    if host is None:
        from partitioner.profile.cache import machine_info

        host = f"{socket.gethostname()}-{machine_info()['id'][:8]}"
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", host) or "host"
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    return (cache_dir or settings.cache_dir()) / "platforms" / f"{stem}-{host}.yaml"


def _r(x: float) -> float:
    return round(float(x), _ROUND)


_CLOUD_PROFILES = ("aws-lambda", "openfaas")  # `flatpack deploy --target lambda|openfaas` sends tensors inline


def _deploy_transport(cal: Calibration, profile: PlatformProfile) -> str | None:
    """The transport whose bandwidth becomes the profile's ``bandwidth_mb_s``: what a deployment to this
    platform uses by default (a cloud: inline; the local platform: shm where functions share memory, else
    redis), if it was measured."""
    if profile.name in _CLOUD_PROFILES:
        return "inline" if "inline" in cal.transfers else None
    for name in ("shm", "redis") if profile.shared_memory else ("redis",):
        if name in cal.transfers:
            return name
    return None


def _kept(old: Any, measured: Any) -> str:
    """A source's note on the entries of a mapping kept from the base profile (not measured this time)."""
    kept = sorted(str(k) for k in (old or {}) if k not in measured)
    return f"; {', '.join(kept)} kept from the base profile" if kept else ""


def _measured(cal: Calibration) -> str:
    """What was measured: ``the local platform at URL (profile P)``, ``AWS Lambda at URL``."""
    what = cal.target if cal.platform_url in cal.target else f"{cal.target} at {cal.platform_url}"
    return f"{what} (profile {cal.platform_profile})" if cal.platform_profile else what


def _tensors_source(cal: Calibration) -> str:
    """Where each transport's ``tensor_ms`` came from ("" where none was measured)."""
    moves = [t.tensors for t in cal.transfers.values() if t.tensors is not None]
    if not moves:
        return ""
    m = moves[0]
    how = "metered time" if m.billed_ms is not None else "round trip (over its four moves)"
    return (f"; tensor_ms ({', '.join(t.transport for t in moves)}): a no-op moving {m.tensors} small tensors each "
            f"way against one moving one, {m.samples} invocations each, in turn, the caches evicted before each: "
            f"the {how} each further tensor's get or put adds")


def calibrated_profile_data(base: str | Path, cal: Calibration, where: Provenance) -> dict[str, Any]:
    """The mapping of profile ``base`` (name or YAML path) with ``cal``'s figures in place of its own."""
    data = load_profile_data(base)
    profile = PlatformProfile.from_dict(data, origin=str(resolve_profile_path(base)))
    sources = {str(k): str(v) for k, v in (data.get("sources") or {}).items()}
    by = f"measured by flatpack calibrate on {where.host}, {where.date} (see calibration)"
    inv = cal.invoke
    data["invoke_latency_ms"] = {"mu": _r(inv.mu), "sigma": _r(inv.sigma), "tau": _r(inv.tau)}
    sources["invoke_latency_ms"] = (
        f"{by}; {cal.invoke_samples} warm round trips of a no-op function ({cal.probe_mb} MB) fitted as an "
        f"ex-Gaussian by maximum likelihood (scipy.stats.exponnorm); p50 {cal.invoke_p50_ms:.3f} ms, "
        f"p99 {cal.invoke_p99_ms:.3f} ms")
    if cal.billed_overhead_ms is not None:
        data["billed_overhead_ms"] = _r(cal.billed_overhead_ms)
        sources["billed_overhead_ms"] = (
            f"{by}; the platform meter's mean duration of those {cal.invoke_samples} no-op invocations")
    else:
        kept = sources.get("billed_overhead_ms", "the base profile's default")
        sources["billed_overhead_ms"] = (
            f"not measured by flatpack calibrate ({cal.target} reported no billed duration); "
            f"kept from the base profile: {kept}")
    if cal.transfers:
        kept = _kept(data.get("transports"), cal.transfers)
        data["transports"] = {**(data.get("transports") or {}), **{
            name: {"latency_ms": _r(t.cost.latency_ms), "bandwidth_mb_s": _r(t.cost.bandwidth_mb_s),
                   **({"tensor_ms": _r(t.cost.tensor_ms)} if t.cost.tensor_ms is not None else {})}
            for name, t in cal.transfers.items()
        }}
        sizes = sorted({p[0] for t in cal.transfers.values() for p in t.points})
        counts = {t.samples for t in cal.transfers.values()}
        samples = (str(counts.pop()) if len(counts) == 1
                   else ", ".join(f"{k} {t.samples}" for k, t in cal.transfers.items()))
        skipped = "".join(f"; {k} not measured: {v}" for k, v in cal.skipped.items())
        sources["transports"] = (
            f"{by}; {', '.join(cal.transfers)}: an echo function's round trips at {len(sizes)} sizes "
            f"({sizes[0]}..{sizes[-1]} bytes), {samples} per size, each paired with a no-op's, after evicting "
            f"the caches; median (echo - no-op) / transfers per round, fitted as latency + bytes / bandwidth "
            f"(least squares weighted by each point's standard error){_tensors_source(cal)}{skipped}{kept}")
        main = _deploy_transport(cal, profile)
        if main is not None:
            data["bandwidth_mb_s"] = _r(cal.transfers[main].cost.bandwidth_mb_s)
            sources["bandwidth_mb_s"] = f"{by}; the {main} transport's fitted bandwidth (see transports)"
    if cal.cold_start_ms is not None:
        data["cold_start_ms"] = _r(cal.cold_start_ms)
        init = f" (the meter's instance start-up: {cal.cold_init_ms:.1f} ms)" if cal.cold_init_ms is not None else ""
        sources["cold_start_ms"] = (
            f"{by}; median over {cal.cold_starts} cold starts (the no-op function deployed again) of the "
            f"first round trip beyond a warm one{init}")
    if cal.cpu_share:
        kept = _kept(data.get("cpu_share"), {c.memory_mb for c in cal.cpu_share})
        data["cpu_share"] = {**(data.get("cpu_share") or {}),
                             **{c.memory_mb: _r(c.measured_slowdown) for c in cal.cpu_share}}
        shares = ", ".join(f"{c.memory_mb} MB: x{c.measured_slowdown:.2f} measured"
                           + (f" (±{100 * c.ratio_se:.1f} %)" if c.ratio_se is not None else "")
                           + f", x{c.expected_slowdown:.2f} expected" for c in cal.cpu_share)
        ref = cal.cpu_share[0]
        sources["cpu_share"] = (
            f"{by}; a fixed computation's {'metered' if ref.metered else 'handler (as the function timed it)'} "
            f"time (a mean of its repeats, the slowest and fastest tenth left out) at each memory size over the "
            f"same at {ref.reference_mb} MB (one vCPU), {ref.samples} invocations each, interleaved ({shares}){kept}")
    jitter = [c.jitter_sigma for c in cal.cpu_share if c.jitter_sigma > 0]
    if jitter:
        data["jitter_sigma"] = _r(max(jitter))
        each = ", ".join(f"{c.memory_mb} MB and {c.reference_mb} MB: {c.jitter_sigma:.3f}" for c in cal.cpu_share)
        sources["jitter_sigma"] = (
            f"{by}; the standard deviation of the log durations of the CPU-share probe's repeats, each size's "
            f"around its median ({each})")
    if cal.dispatch:
        data["dispatch_ms"] = {d.memory_mb: _r(d.dispatch_ms) for d in cal.dispatch}
        cpus = "; ".join(f"{d.memory_mb} MB: " + ", ".join(f"{n} workers {ms:.3f} ms"
                                                            for n, ms in sorted(d.master_cpu_ms.items()))
                         for d in cal.dispatch)
        d = cal.dispatch[0]
        sources["dispatch_ms"] = (
            f"{by}; per master memory, fork probes (a small convolution split into tiles that workers run, "
            f"{d.transport}), {d.samples} requests each, interleaved: the master's median CPU per request "
            f"({cpus}) per added worker, less one put and one get ({d.transfer_latency_ms:.3f} ms each)")
        # a stage's own CPU beyond its workers', at the first size measured: the probe's, one vCPU
        data["stage_overhead_ms"] = _r(d.stage_ms)
        sources["stage_overhead_ms"] = (
            f"{by}; the same fork probes at {d.memory_mb} MB: the master's median CPU per request at no workers, "
            f"on the line through {' and '.join(str(n) for n in sorted(d.master_cpu_ms))} workers (its "
            f"bookkeeping and joining per stage, the whole input's one put of a spatial split included)")
    if cal.handling is not None:
        h = cal.handling
        data["handling_ms"] = _r(h.handling_ms)
        sources["handling_ms"] = (
            f"{by}; a no-op's median round trip at {h.memory_mb} MB ({h.rtt_ms:.3f} ms) beyond the same at "
            f"{h.reference_mb} MB ({h.reference_rtt_ms:.3f} ms), {h.samples} each, interleaved, over the share's "
            f"stretch less one ({h.stretch:.2f} - 1)")
    sources["calibration"] = (
        f"measured by flatpack calibrate: {where.line()}; {_measured(cal)}; base profile "
        f"{resolve_profile_path(base)}; took {cal.seconds:.1f} s")
    data.pop("sources", None)
    data["sources"] = sources  # last, after any field added above
    PlatformProfile.from_dict(data, origin="the calibrated profile")  # what is written must load
    return data


def write_profile(path: Path, base: str | Path, cal: Calibration, where: Provenance) -> Path:
    """Write the calibrated profile (see :func:`calibrated_profile_data`) to ``path``; returns it."""
    data = calibrated_profile_data(base, cal, where)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# Platform profile {data['name']!r} calibrated by `flatpack calibrate` on {where.host}, {where.date}\n"
              f"# from {resolve_profile_path(base)}: measured fields replace the base profile's (see sources).\n")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(header + yaml.safe_dump(data, sort_keys=False, width=120, allow_unicode=True))
    tmp.replace(path)
    load_profile(path)
    return path

"""Fitting the simulator to live measurements: invoke latency, compute scale, other load, each worker's share,
wake-up work, and the compute times' spread.

Every fit here takes figures measured at one client (see :mod:`bench.sim.validation` for how they are
measured) and returns the plan and platform that reproduce them in simulation; none of the figures a
validation compares against enters a fit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from bench.sim.simulator import SimPlan, SimPlatform, simulate

__all__ = ["Fit", "calibrate", "calibrate_with_meter", "calibrate_workers", "fit_spread", "fit_wake",
           "sim_p50"]


@dataclass(frozen=True)
class Fit:
    """How :func:`calibrate` matched the measured 1-client p50 and CPU per request.

    ``method``: "delay" or "weight" (see :func:`calibrate`); ``compute_scale``: the factor on every compute
    time of the perf model; ``weight`` x the counted background groups (or ``constant`` when little was
    counted) is the simulated other load; ``extra_delay_ms``: delay added to every invocation on the critical
    path; ``measured_background``: the groups counted during the 1-client run; ``how``: in words.
    ``offpath_cpu_ms``: CPU per request run beside the critical path (when the fit put some there, and always
    after :func:`calibrate_with_meter`); ``worker_scales``: each worker function's work relative to the perf
    model's share of it (:func:`calibrate_with_meter` only).
    """

    method: str
    compute_scale: float
    how: str
    weight: float | None = None
    constant: float = 0.0
    extra_delay_ms: float = 0.0
    measured_background: float = 0.0
    offpath_cpu_ms: float | None = None
    worker_scales: dict[str, float] | None = None

    def background_for(self, measured: float) -> float:
        """The simulation's background threads for a run during which ``measured`` were seen."""
        return self.weight * measured if self.weight is not None else float(self.constant or 0.0)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "compute_scale": self.compute_scale, "weight": self.weight,
                               "constant": self.constant, "extra_delay_ms": self.extra_delay_ms,
                               "measured_background": self.measured_background, "how": self.how}
        if self.worker_scales is not None:
            out["worker_scales"] = dict(self.worker_scales)
        if self.offpath_cpu_ms is not None:
            out["offpath_cpu_ms"] = self.offpath_cpu_ms
        return out


def _bisect(f: Callable[[float], float], target: float, lo: float, hi: float, tol: float) -> float:
    """The x in [lo, hi] where increasing ``f`` reaches ``target``, to ``tol``."""
    for _ in range(40):
        mid = (lo + hi) / 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo < tol:
            break
    return (lo + hi) / 2


def _fit_from_zero(f: Callable[[float], float], target: float, hi: float, cap: float, tol: float) -> float:
    """The x >= 0 where increasing ``f`` reaches ``target``: 0 if ``f(0)`` already does; else ``hi`` doubled
    until it does (at most to ``cap``), then bisected to ``tol``."""
    if f(0.0) >= target:
        return 0.0
    while f(hi) < target and hi < cap:
        hi *= 2
    return _bisect(f, target, 0.0, hi, tol)


def sim_p50(plan: SimPlan, platform: SimPlatform, n: int, seed: int) -> float:
    """One client's simulated p50 (``n`` requests after one warm-up)."""
    return simulate(plan, platform, clients=1, requests_per_client=n, warmup=1, seed=seed).summary()["p50_ms"]


def calibrate(plan: SimPlan, platform: SimPlatform, *, p50_ms: float, cpu_ms: float, background: float = 0.0,
              n: int = 200, seed: int = 0, method: str = "delay") -> tuple[SimPlan, SimPlatform, Fit]:
    """The plan and platform calibrated to one client's measured p50 and CPU time per request.

    1. CPU per request = scale x (the perf model's compute) + invocations x (the platform's per-invocation
       CPU, from the no-op function): that fixes the scale.
    2. Other users' load is modelled as always-busy background groups sharing the cores: ``weight`` x the
       number counted while a run goes (``background`` for this one).
    3. ``method="delay"``: the weight is 1 (the kernel shares the cores fairly between groups), and what the
       1-client p50 has beyond the simulation is a delay (not CPU) added to every invocation on the
       critical path; if the simulation is slower than measured instead, the weight is fitted below 1.
       ``method="weight"``: the weight is fitted to the 1-client p50 (on a quiet machine: a constant
       background).
    If even with no background the simulation is slower than measured, part of the CPU runs beside the
    critical path (the platform's and client's threads while the functions compute): the scale is fitted
    to the p50 with the rest of the measured CPU per request as off-path work, so the simulated CPU per
    request, and with it the capacity under load, stays the measured one."""
    work = plan.total_work_ms()
    n_inv = 1 + sum(len(st.workers) for st in plan.stages)
    alpha = max(0.05, (cpu_ms - n_inv * platform.invoke_cpu_ms) / work)
    fit = Fit(method=method, compute_scale=alpha, how="", measured_background=background)

    def p50(a: float, bg: float, pf: SimPlatform = platform) -> float:
        return sim_p50(plan.scaled(a), replace(pf, background=bg), n, seed)

    def off(a: float) -> SimPlatform:
        """The platform with the measured CPU per request that scale ``a`` leaves out run off the path."""
        return replace(platform, offpath_cpu_ms=max(0.0, (alpha - a) * work))

    def bisect(f: Callable[[float], float], lo: float, hi: float, tol: float) -> float:
        return _bisect(f, p50_ms, lo, hi, tol)

    def with_delay(d: float) -> SimPlatform:
        inv = platform.invoke
        client = platform.client_invoke or inv
        return replace(platform, invoke=replace(inv, mu=inv.mu + d), client_invoke=replace(client, mu=client.mu + d))

    if method == "delay" and platform.shared_host and p50(alpha, background) <= p50_ms:
        k = 1 + sum(1 for st in plan.stages if st.workers)  # invocations on a request's critical path
        hi = 2 * (p50_ms - p50(alpha, background)) / k + 1.0
        d = bisect(lambda x: p50(alpha, background, with_delay(x)), 0.0, hi, 0.01)
        fit = replace(fit, weight=1.0, extra_delay_ms=d,
                      how=f"scale from the measured CPU per request; the counted background as it is; the rest of the "
                          f"1-client p50 as {d:.2f} ms of delay per invocation on the critical path")
        return plan.scaled(alpha), replace(with_delay(d), background=background), fit
    if platform.shared_host and p50(alpha, 0.0) < p50_ms:
        per = max(background, 0.0) if background >= 0.2 else 1.0
        hi = 1.0
        while p50(alpha, per * hi) < p50_ms and hi < 512:
            hi *= 2
        x = bisect(lambda w: p50(alpha, per * w), 0.0, hi, 0.005)
        if background >= 0.2:
            fit = replace(fit, weight=x, how="scale from the measured CPU per request; background = weight x the "
                                             "counted background groups, the weight fitted to the 1-client p50")
        else:
            fit = replace(fit, constant=x, how="scale from the measured CPU per request; a constant background "
                                               "(little was counted) fitted to the 1-client p50")
    elif platform.shared_host and p50(0.02, 0.0, off(0.02)) < p50_ms:
        a = bisect(lambda a: p50(a, 0.0, off(a)), 0.02, alpha, 1e-3)
        platform = off(a)
        fit = replace(fit, compute_scale=a, offpath_cpu_ms=platform.offpath_cpu_ms,
                      how=f"scale fitted to the 1-client p50 with the rest of the measured CPU per request "
                          f"({platform.offpath_cpu_ms:.1f} ms) run beside the critical path; no background")
    else:
        fit = replace(fit, compute_scale=bisect(lambda a: p50(a, 0.0), 0.02, alpha, 1e-3),
                      how="scale fitted to the 1-client p50 (the measured CPU per request would make it slower "
                          "than measured); no background")
    return plan.scaled(fit.compute_scale), replace(platform, background=fit.background_for(background)), fit


def calibrate_workers(plan: SimPlan, platform: SimPlatform, live_duration_ms: Mapping[str, float], *,
                      n: int = 100, seed: int = 0, rounds: int = 3) -> tuple[SimPlan, SimPlatform, dict[str, float]]:
    """Each worker function's work set so that its simulated duration per invocation at one client is the
    meter's (``live_duration_ms``: durations, as billing rounds them up). The perf model spreads the compute
    over the parts by FLOPs, and a part's real share differs (a tile's halo, the layers' speeds): the meter
    says what each part takes. The CPU taken from (or added to) the workers moves to the work beside the
    critical path, so the CPU per request, and the capacity, stay the measured ones. Returns the plan, the
    platform and the factor per function."""
    workers = {w.function for st in plan.stages for w in st.workers}
    factors = dict.fromkeys(workers, 1.0)
    ovh = platform.invoke_cpu_ms / 2  # the callee's half of the invoke path, billed but not the part's work
    cur = plan
    for _ in range(rounds):
        sim = simulate(cur, platform, clients=1, requests_per_client=n, warmup=1, seed=seed).summary()
        took = sim["duration_ms_per_invocation"]
        for f in workers:
            if f in live_duration_ms and took.get(f, 0) > ovh:
                factors[f] *= max(0.05, live_duration_ms[f] - ovh) / (took[f] - ovh)
        cur = plan.with_worker_scales(factors)
    moved = plan.total_work_ms() - cur.total_work_ms()
    return cur, replace(platform, offpath_cpu_ms=max(0.0, platform.offpath_cpu_ms + moved)), factors


def calibrate_with_meter(plan: SimPlan, platform: SimPlatform, live_duration_ms: Mapping[str, float], *,
                         rounds: int = 2, **kw: Any) -> tuple[SimPlan, SimPlatform, Fit]:
    """:func:`calibrate` (to the 1-client p50 and CPU per request) and :func:`calibrate_workers` (each worker
    to its metered time) in turn, as each moves the other's target. The fit's ``worker_scales``: each worker
    function's work relative to the perf model's share of it, after the common scale."""
    factors: dict[str, float] = {}
    for _ in range(rounds):
        cal_plan, cal_pf, fit = calibrate(plan.with_worker_scales(factors), platform, **kw)
        cal_plan, cal_pf, more = calibrate_workers(cal_plan, cal_pf, live_duration_ms, seed=kw.get("seed", 0))
        factors = {f: factors.get(f, 1.0) * x for f, x in more.items()}
    return cal_plan, cal_pf, replace(fit, worker_scales=factors, offpath_cpu_ms=cal_pf.offpath_cpu_ms)


def fit_wake(plan: SimPlan, platform: SimPlatform, *, p50_ms: float, think_ms: float, n: int = 100,
             seed: int = 0) -> SimPlatform:
    """The platform with ``wake_ms`` fitted so that one client pausing ``think_ms`` after each response has
    the measured p50 (a core idle for half that or more counts as woken: none is in a back-to-back loop,
    both are after each pause). 0 if the pauses cost nothing; unchanged without time slices."""
    if not platform.time_slice_ms or not platform.shared_host:
        return platform
    pf = replace(platform, wake_after_ms=think_ms / 2)

    def p50(x: float) -> float:
        return simulate(plan, replace(pf, wake_ms=x), clients=1, requests_per_client=n, warmup=1, seed=seed,
                        think_ms=think_ms).summary()["p50_ms"]

    return replace(pf, wake_ms=_fit_from_zero(p50, p50_ms, 1.0, 1e4, 0.02))


def fit_spread(plan: SimPlan, platform: SimPlatform, *, p50_ms: float, p95_ms: float, n: int = 400,
               seed: int = 0) -> SimPlatform:
    """The platform with ``work_cv`` fitted so that one client's simulated p95 lies as far above its p50 as
    the measured one does (0 if the simulation's other draws spread it that far already)."""
    def gap(cv: float) -> float:
        s = simulate(plan, replace(platform, work_cv=cv), clients=1, requests_per_client=n, warmup=1,
                     seed=seed).summary()
        return s["p95_ms"] - s["p50_ms"]

    return replace(platform, work_cv=_fit_from_zero(gap, p95_ms - p50_ms, 0.25, 4.0, 0.005))

"""The serverless simulator against queueing theory (M/G/1 processor sharing, M/D/1, closed loops),
Lambda semantics (concurrency limits, cold starts after idle timeouts, billing granularity), fork-join
on shared cores, and its calibration."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.load.trace import poisson_arrivals
from bench.sim.simulator import Kernel, SimPlan, SimPlatform, SimStage, SimWorker, TimeSliceCpu, simulate
from platforms import ExGauss

NO_DELAY = ExGauss(0.0, 0.0, 0.0)


def one_function(work_ms: float = 10.0, memory_mb: int = 1024) -> SimPlan:
    return SimPlan("one", "m", {"m": (memory_mb, 1)}, (SimStage(master_ms=work_ms),))


def platform(**kw: object) -> SimPlatform:
    base = SimPlatform(cores=None, invoke=NO_DELAY, concurrency=1000, cold_start_ms=0.0, idle_timeout_ms=1e12)
    return replace(base, **kw)  # type: ignore[arg-type]


def arrivals_ms(rate_per_s: float, seconds: float, seed: int = 1) -> list[float]:
    return [1e3 * t for t in poisson_arrivals(rate_per_s, seconds, seed=seed)]


@pytest.mark.parametrize("rho", [0.3, 0.7])
def test_mg1_processor_sharing_mean_latency(rho: float) -> None:
    """One core shared by every request (M/G/1-PS): mean response time S / (1 - rho), whatever the
    service distribution; the core is busy a fraction rho of the time."""
    s_ms = 10.0
    r = simulate(one_function(s_ms), platform(cores=1.0), arrivals_ms=arrivals_ms(rho / s_ms * 1e3, 400))
    summ = r.summary()
    assert summ["mean_ms"] == pytest.approx(s_ms / (1 - rho), rel=0.06)
    assert summ["cpu_utilisation"] == pytest.approx(rho, rel=0.05)


def test_md1_queue_behind_one_instance() -> None:
    """One instance (concurrency 1), deterministic service, Poisson arrivals: M/D/1, mean response time
    S + rho S / (2 (1 - rho)) (Pollaczek-Khinchine)."""
    s_ms, rho = 10.0, 0.6
    r = simulate(one_function(s_ms), platform(concurrency=1), arrivals_ms=arrivals_ms(rho / s_ms * 1e3, 400, 2))
    assert r.summary()["mean_ms"] == pytest.approx(s_ms + rho * s_ms / (2 * (1 - rho)), rel=0.05)


def test_closed_loop_saturates_the_cores() -> None:
    """N clients on c cores with no think time: throughput c / S and latency N S / c exactly."""
    s_ms, n, cores = 10.0, 5, 2.0
    r = simulate(one_function(s_ms), platform(cores=cores), clients=n, requests_per_client=40, warmup=2)
    summ = r.summary()
    assert summ["requests"] == n * 40
    assert summ["p50_ms"] == pytest.approx(n * s_ms / cores, rel=1e-6)
    assert summ["throughput_rps"] == pytest.approx(cores / s_ms * 1e3, rel=0.01)


def test_background_load_takes_its_share() -> None:
    """Two always-busy background threads on two cores: a lone request runs at half speed."""
    r = simulate(one_function(10.0), platform(cores=2.0, background=2.0), clients=1, requests_per_client=5)
    assert r.summary()["p50_ms"] == pytest.approx(10.0 * (1 + 2.0) / 2.0, rel=1e-6)


def test_concurrency_limit_queues_in_order() -> None:
    r = simulate(one_function(10.0), platform(concurrency=1), arrivals_ms=[0.0, 0.0, 0.0])
    assert sorted(r.latencies_ms.tolist()) == pytest.approx([10.0, 20.0, 30.0])
    assert r.functions["m"]["waits"] == 2 and r.functions["m"]["cold_starts"] == 0


def test_cold_starts_happen_after_idle_timeouts() -> None:
    pf = platform(cold_start_ms=100.0, idle_timeout_ms=1000.0)
    r = simulate(one_function(10.0), pf, arrivals_ms=[0.0, 500.0, 5000.0], prewarm=False)
    # cold (first), warm (500 ms idle < 1 s), cold again (reaped after 4.5 s idle)
    assert r.latencies_ms.tolist() == pytest.approx([110.0, 10.0, 110.0])
    assert r.functions["m"]["cold_starts"] == 2 and r.functions["m"]["reaped"] == 1
    warm = simulate(one_function(10.0), pf, arrivals_ms=[0.0, 500.0, 900.0], prewarm=True)
    assert warm.summary()["cold_starts"] == 0


def test_scale_out_starts_instances_on_demand() -> None:
    pf = platform(cold_start_ms=50.0)
    r = simulate(one_function(10.0), pf, arrivals_ms=[0.0, 1.0, 2.0, 3.0], prewarm=True)
    assert r.functions["m"]["cold_starts"] == 3 and r.functions["m"]["max_instances"] == 4


def test_prewarm_starts_with_as_many_instances_as_given() -> None:
    """A simulation mirroring a live deployment starts with its warm instances: a burst no larger meets
    no cold start, one request more meets exactly one."""
    pf = platform(cold_start_ms=50.0)
    r = simulate(one_function(10.0), pf, arrivals_ms=[0.0, 1.0, 2.0], prewarm={"m": 3})
    assert r.functions["m"]["cold_starts"] == 0 and r.functions["m"]["max_instances"] == 3
    assert r.latencies_ms.tolist() == pytest.approx([10.0, 10.0, 10.0])
    r = simulate(one_function(10.0), pf, arrivals_ms=[0.0, 1.0, 2.0, 3.0], prewarm={"m": 3})
    assert r.functions["m"]["cold_starts"] == 1 and r.functions["m"]["max_instances"] == 4
    r = simulate(one_function(10.0), pf, arrivals_ms=[0.0], prewarm={})  # not listed: none warm
    assert r.functions["m"]["cold_starts"] == 1


@pytest.mark.parametrize(("granularity", "billed"), [(1.0, 130.0), (100.0, 200.0)])
def test_billing_granularity(granularity: float, billed: float) -> None:
    pf = platform(granularity_ms=granularity, price_gb_s=1.0, price_request=0.5)
    r = simulate(one_function(130.0, memory_mb=2048), pf, arrivals_ms=[0.0, 1000.0])
    f = r.functions["m"]
    assert f["billed_ms"] == pytest.approx(2 * billed)
    assert f["billed_gb_s"] == pytest.approx(2 * 2.0 * billed / 1000)
    assert f["cost_usd"] == pytest.approx(2 * 2.0 * billed / 1000 + 2 * 0.5)
    assert r.summary()["mc_gb_s_per_request"] == pytest.approx(2.0 * billed / 1000)


def fork_join() -> SimPlan:
    st = SimStage(master_ms=10.0, workers=(SimWorker("w1", 10.0), SimWorker("w2", 10.0)))
    return SimPlan("fj", "m", {"m": (1024, 1), "w1": (512, 1), "w2": (512, 1)}, (st, SimStage(master_ms=5.0)),
                   used_mb={"m": 512.0, "w1": 256.0, "w2": 256.0})


def test_fork_join_runs_in_parallel_or_shares_the_cores() -> None:
    free = simulate(fork_join(), platform(), arrivals_ms=[0.0])
    assert free.latencies_ms[0] == pytest.approx(15.0)  # 10 in parallel, then 5
    shared = simulate(fork_join(), platform(cores=1.0), arrivals_ms=[0.0])
    assert shared.latencies_ms[0] == pytest.approx(35.0)  # three 10 ms parts on one core, then 5
    two = simulate(fork_join(), platform(cores=2.0), arrivals_ms=[0.0])
    assert two.latencies_ms[0] == pytest.approx(20.0)  # three parts on two cores: 15, then 5
    s = free.summary()
    # billed: master 15 ms x 1 GB, workers 10 ms x 0.5 GB each; memory used half of allocated
    assert s["billed_gb_s"] == pytest.approx((15 * 1.0 + 2 * 10 * 0.5) / 1000)
    assert s["memory_utilisation"] == pytest.approx(0.5)


def test_a_cpu_share_stretches_a_function_and_only_oversubscribed_shares_contend() -> None:
    """A function whose memory buys 0.29 of a core takes 1/0.29 as long; on two cores, three such parts at
    once take no longer than one (0.87 cores demanded); eight at once demand 2.3 cores and slow down by
    that over 2, as the perf model says (its ``slow`` factor)."""
    share = 512 / 1769
    alone = simulate(replace(one_function(10.0, 512), shares={"m": share}), platform(cores=2.0), arrivals_ms=[0.0])
    assert alone.latencies_ms[0] == pytest.approx(10.0 / share)

    def fanout(n: int) -> SimPlan:
        workers = tuple(SimWorker(f"w{i}", 10.0) for i in range(n))
        fns = {"m": (512, 1), **{w.function: (512, 1) for w in workers}}
        return SimPlan("fan", "m", fns, (SimStage(workers=workers),), shares=dict.fromkeys(fns, share))

    three = simulate(fanout(3), platform(cores=2.0), arrivals_ms=[0.0])
    assert three.latencies_ms[0] == pytest.approx(10.0 / share)
    eight = simulate(fanout(8), platform(cores=2.0), arrivals_ms=[0.0])
    assert eight.latencies_ms[0] == pytest.approx(10.0 / share * 8 * share / 2.0)
    with pytest.raises(ValueError, match="share"):
        TimeSliceCpu(Kernel(), 2, time_slice_ms=3.0).work(10.0, 1, None, 0.5)


def test_sim_plan_gives_local_functions_below_one_vcpu_their_share() -> None:
    from bench.sim.plans import sim_plan_for_choices
    from functions.plan import Split
    from partitioner.graph import LayerGraph
    from partitioner.perfmodel import ComputeModel, PerfModel, PlatformFacts, StageChoice
    from platforms import load_profile
    from tests.onnx_builders import conv_stack

    lg = LayerGraph.load(conv_stack([{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 8}] * 2,
                                    cin=3, h=16, w=16))
    pm = PerfModel(lg, PlatformFacts.from_profile(load_profile("local")), ComputeModel.from_flops(lg))
    choices = [StageChoice(0, len(lg.units) - 1, Split("spatial", (2, 1)), True, 0)]
    at_512 = sim_plan_for_choices(pm, choices, 512, shared_cores=True)
    at_1769 = sim_plan_for_choices(pm, choices, 1769, shared_cores=True)
    assert at_512.shares == {"master": pytest.approx(512 / 1769), "s00-p01": pytest.approx(512 / 1769)}
    assert at_1769.shares == {}
    # the work is CPU time at whole threads either way: the share is the simulator's to apply
    assert at_512.stages[0].master_ms == pytest.approx(at_1769.stages[0].master_ms)


def test_sim_plan_prices_a_part_with_the_share_of_a_models_own_slow_down_its_weights_take() -> None:
    """As the perf model does (``PlatformFacts.share_factor``): a worker holding the first of three convolutions
    (a sixth of the weights) takes a sixth of the model's difference from calibrate's probe below one vCPU."""
    import dataclasses

    from bench.sim.plans import sim_plan_for_choices
    from functions.plan import Split
    from partitioner.graph import LayerGraph
    from partitioner.perfmodel import ComputeModel, PerfModel, PlatformFacts, StageChoice
    from platforms import load_profile
    from tests.onnx_builders import conv_stack

    lg = LayerGraph.load(conv_stack([{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 8}] * 3,
                                    cin=3, h=16, w=16))
    probe = dataclasses.replace(PlatformFacts.from_profile(load_profile("local")),
                                share_factors=((256 / 1769, 1.1), (1024 / 1769, 1.05)))
    pm = PerfModel(lg, probe, ComputeModel.from_flops(lg))
    one = [StageChoice(0, 0, Split(), False, 256)]
    before = sim_plan_for_choices(pm, one, 1769, shared_cores=True).stages[0].workers[0].work_ms
    pm.use_platform(pm.platform.with_model_share(256 / 1769, 1.1 * 1.6))
    after = sim_plan_for_choices(pm, one, 1769, shared_cores=True).stages[0].workers[0].work_ms
    whole = pm.platform.share_factor(256 / 1769)
    sixth = pm.reread_share(lg.units[0].weight_bytes, 0, 0)
    assert sixth == pytest.approx(lg.units[0].weight_bytes / sum(u.weight_bytes for u in lg.units))
    part = pm.platform.share_factor(256 / 1769, sixth)
    assert part == pytest.approx(1.1 + sixth * (whole - 1.1))
    moves = pm.platform.transfer_ms(pm.part_costs(0, 0, Split())[0].input_bytes) + pm.platform.transfer_ms(
        pm.part_costs(0, 0, Split())[0].output_bytes)
    # the simulator applies the function's share (the model's whole slow-down): the part's work is the rest
    assert after - moves == pytest.approx((before - moves) * part / whole)
    assert pm.reread_share(sum(u.weight_bytes for u in lg.units), 0, len(lg.units) - 1) == 1.0


def test_invoke_latency_adds_to_each_fork() -> None:
    pf = platform(invoke=ExGauss(2.0, 0.0, 0.0), client_invoke=NO_DELAY)
    r = simulate(fork_join(), pf, arrivals_ms=[0.0])
    assert r.latencies_ms[0] == pytest.approx(17.0)  # the workers' 10 ms + a 2 ms round trip; master 10 meanwhile


def _finish_times(cpu: TimeSliceCpu, k: Kernel, jobs: list[tuple[float, int, object]]) -> list[float]:
    done: list[float] = [float("nan")] * len(jobs)
    for i, (ms, threads, owner) in enumerate(jobs):
        cpu.work(ms, threads, owner).on(lambda _e, i=i: done.__setitem__(i, k.now))
    k.run()
    return done


def test_time_slices_share_per_core_queues() -> None:
    """Three 12 ms threads on two cores, 3 ms slices: two start on the idle cores, the third queues on one
    of them and takes turns there; the lone thread ends at 12 ms, then its core takes the waiting thread.
    Same makespan as processor sharing (18 ms: the cores never idle with work waiting), lower mean latency."""
    k = Kernel()
    done = _finish_times(TimeSliceCpu(k, 2, time_slice_ms=3.0), k, [(12.0, 1, None)] * 3)
    assert sorted(done) == pytest.approx([12.0, 18.0, 18.0])


def test_time_slices_run_a_multithreaded_job_on_every_core() -> None:
    k = Kernel()
    cpu = TimeSliceCpu(k, 2, time_slice_ms=3.0)
    assert _finish_times(cpu, k, [(10.0, 2, None)]) == [pytest.approx(10.0)]
    assert cpu.busy_core_ms == pytest.approx(20.0)


def test_a_thread_going_on_with_its_next_work_keeps_its_core() -> None:
    """One core, a 10 ms thread queued (at 0.5 ms) behind a function that does 1 ms, then (no wait between)
    1 ms more:
    the function's second piece goes on in its slice instead of queueing behind the other thread."""
    k = Kernel()
    cpu = TimeSliceCpu(k, 1, time_slice_ms=3.0)
    owner, t = object(), {}

    def function() -> object:
        yield cpu.work(1.0, 1, owner)
        yield cpu.work(1.0, 1, owner)
        t["function"] = k.now

    k.process(function())
    k.call_at(0.5, lambda: cpu.work(10.0).on(lambda _e: t.__setitem__("other", k.now)))
    k.run()
    assert t == {"function": pytest.approx(2.0), "other": pytest.approx(12.0)}


def test_a_core_waking_from_a_long_idle_adds_its_wake_up_work() -> None:
    """A core idle for 10 ms or more adds 2 ms to the first thread it runs; after a shorter idle, nothing."""
    k = Kernel()
    cpu = TimeSliceCpu(k, 1, time_slice_ms=3.0, wake_ms=2.0, wake_after_ms=10.0)
    done: dict[str, float] = {}
    for name, at in (("first", 0.0), ("soon after", 5.0), ("after a rest", 30.0)):
        k.call_at(at, lambda n=name: cpu.work(1.0).on(lambda _e: done.__setitem__(n, k.now)))
    k.run()
    assert done == {"first": pytest.approx(1.0), "soon after": pytest.approx(6.0), "after a rest": pytest.approx(33.0)}


def test_wake_up_work_is_fitted_to_the_paused_p50() -> None:
    """The truth: cores idle for 20 ms or more add 1.5 ms; fitted back from one client pausing 40 ms."""
    from bench.sim.calibration import fit_wake

    plan, think = fork_join(), 40.0
    pf = platform(cores=2.0, time_slice_ms=3.0, invoke=ExGauss(1.0, 0.1, 0.5))
    truth = replace(pf, wake_ms=1.5, wake_after_ms=think / 2)
    p50 = simulate(plan, truth, clients=1, requests_per_client=100, warmup=1, think_ms=think).summary()["p50_ms"]
    assert fit_wake(plan, pf, p50_ms=p50, think_ms=think).wake_ms == pytest.approx(1.5, abs=0.1)
    assert fit_wake(plan, pf, p50_ms=p50 - 5, think_ms=think).wake_ms == 0.0  # pauses that cost nothing


def test_time_slices_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="cores >= 1"):
        TimeSliceCpu(Kernel(), 0, time_slice_ms=3.0)
    with pytest.raises(ValueError, match="time_slice_ms > 0"):
        TimeSliceCpu(Kernel(), 2, time_slice_ms=0.0)


def test_time_slices_saturate_the_cores_like_processor_sharing() -> None:
    s_ms, n = 10.0, 5
    r = simulate(one_function(s_ms), platform(cores=2.0, time_slice_ms=3.0), clients=n, requests_per_client=40,
                 warmup=2).summary()
    assert r["throughput_rps"] == pytest.approx(2 / s_ms * 1e3, rel=0.01)
    assert r["cpu_utilisation"] > 0.98  # no core idles while a thread waits


def test_time_slices_keep_a_closed_loops_fork_joins_out_of_step() -> None:
    """Under processor sharing the requests of a closed loop fall into step and every worker runs while the
    other requests' workers do; with time slices on per-core queues they do not (as on a real machine, where
    the workers' metered time under load is far below processor sharing's). Same work, same cores: the
    throughput is the same, the workers' billed time is not."""
    plan = fork_join()
    loop = {"clients": 3, "requests_per_client": 60, "warmup": 2}
    ps = simulate(plan, platform(cores=2.0), **loop).summary()  # type: ignore[arg-type]
    ts = simulate(plan, platform(cores=2.0, time_slice_ms=3.0), **loop).summary()  # type: ignore[arg-type]
    assert ts["throughput_rps"] == pytest.approx(ps["throughput_rps"], rel=0.05)
    assert ts["billed_ms_per_invocation"]["w1"] < 0.85 * ps["billed_ms_per_invocation"]["w1"]


def test_worker_calibration_matches_the_meter_and_keeps_the_cpu() -> None:
    """The truth's worker w1 takes 60 % of what the perf model gives it: fitted from its metered time at one
    client, with the CPU it does not take moved beside the critical path (the CPU per request is measured)."""
    from bench.sim.calibration import calibrate_workers

    plan = fork_join()
    pf = platform(cores=2.0, time_slice_ms=3.0, invoke_cpu_ms=0.8)
    truth = plan.with_worker_scales({"w1": 0.6})
    metered = simulate(truth, pf, clients=1, requests_per_client=50, warmup=1).summary()["duration_ms_per_invocation"]
    fitted, fitted_pf, factors = calibrate_workers(plan, pf, metered)
    assert factors["w1"] == pytest.approx(0.6, rel=0.05) and factors["w2"] == pytest.approx(1.0, rel=0.05)
    assert fitted.total_work_ms() + fitted_pf.offpath_cpu_ms == pytest.approx(plan.total_work_ms())


def test_work_spread_keeps_the_mean_and_widens_the_tail() -> None:
    """work_cv draws each invocation's compute around its mean: the CPU per request stays, the p95 grows with
    it, and 0 is exactly the deterministic simulation."""
    plan, loop = fork_join(), {"clients": 1, "requests_per_client": 400, "warmup": 1}
    pf = platform(cores=2.0, time_slice_ms=3.0)
    runs = {cv: simulate(plan, replace(pf, work_cv=cv), **loop) for cv in (0.0, 0.15, 0.3)}  # type: ignore[arg-type]
    base = runs[0.0].summary()
    assert base["p95_ms"] == pytest.approx(base["p50_ms"])  # nothing random without a spread
    for cv in (0.15, 0.3):
        assert runs[cv].cpu_busy_core_ms == pytest.approx(runs[0.0].cpu_busy_core_ms, rel=0.03)
    gaps = [r.summary()["p95_ms"] - r.summary()["p50_ms"] for r in runs.values()]
    assert gaps[0] < gaps[1] < gaps[2]


def test_work_spread_is_fitted_to_the_one_client_p95() -> None:
    """The truth's compute varies with a coefficient of variation of 0.2: fitted back from one client's p50
    and p95 (a different seed than the fit's); a p95 the deterministic simulation reaches fits 0."""
    from bench.sim.calibration import fit_spread

    plan = fork_join()
    pf = platform(cores=2.0, time_slice_ms=3.0, invoke=ExGauss(1.0, 0.1, 0.3))
    live = simulate(plan, replace(pf, work_cv=0.2), clients=1, requests_per_client=400, warmup=1, seed=7).summary()
    assert fit_spread(plan, pf, p50_ms=live["p50_ms"], p95_ms=live["p95_ms"]).work_cv == pytest.approx(0.2, abs=0.04)
    assert fit_spread(plan, pf, p50_ms=live["p50_ms"], p95_ms=live["p50_ms"]).work_cv == 0.0


def test_calibration_runs_pool_by_requests() -> None:
    """The 1-client runs before and after the closed loop calibrate as one: per-request figures weighted by
    requests, samples together; the kernel's share above the processes' CPU is capped."""
    from types import SimpleNamespace

    from bench.sim.live import KERNEL_SHARE_MAX, Probe

    def run(ms: list[float], own: float, machine: float, took: float, bg: float) -> Probe:
        return Probe([SimpleNamespace(latency_ms=x) for x in ms], own, machine, {"w": took}, bg)

    a = run([10.0] * 30, own=20.0, machine=21.0, took=5.0, bg=0.0)
    b = run([14.0] * 10, own=24.0, machine=60.0, took=9.0, bg=1.0)
    both = Probe.pooled([a, b])
    assert len(both.samples) == 40 and both.p50_ms == 10.0
    assert both.process_cpu_ms_per_request == pytest.approx(21.0)
    assert both.took_ms == {"w": pytest.approx(6.0)} and both.background == pytest.approx(0.25)
    assert a.cpu_ms_per_request == pytest.approx(21.0)  # the kernel's share as measured
    assert b.cpu_ms_per_request == pytest.approx(24.0 * (1 + KERNEL_SHARE_MAX))  # other load: capped


def test_calibration_recovers_scale_and_background() -> None:
    """Measurements made by a simulated 'truth' (compute x 1.3, 3 background groups of which 2 were counted,
    i.e. weight 1.5) are fitted back by the weight method."""
    from bench.sim.calibration import calibrate, sim_p50

    plan = fork_join()
    pf = platform(cores=2.0, invoke=ExGauss(1.0, 0.1, 0.5), invoke_cpu_ms=0.8)
    truth_plan, truth_pf = plan.scaled(1.3), replace(pf, background=3.0)
    p50 = sim_p50(truth_plan, truth_pf, 200, 0)
    cpu = truth_plan.total_work_ms() + 3 * pf.invoke_cpu_ms  # master + 2 workers: 3 invocations
    fitted_plan, fitted_pf, fit = calibrate(plan, pf, p50_ms=p50, cpu_ms=cpu, background=2.0, method="weight")
    assert fit.compute_scale == pytest.approx(1.3, rel=1e-6)
    assert fit.weight == pytest.approx(1.5, rel=0.02)
    assert fit.background_for(4.0) == pytest.approx(6.0, rel=0.02)
    assert fitted_pf.background == pytest.approx(3.0, rel=0.02)
    assert fitted_plan.total_work_ms() == pytest.approx(truth_plan.total_work_ms())


def test_calibration_recovers_an_unexplained_delay() -> None:
    """The delay method: the counted background as it is, the rest of the 1-client p50 as delay per
    invocation on the critical path (2 here: the client's call and the stage's fork)."""
    from bench.sim.calibration import calibrate, sim_p50

    plan = fork_join()
    pf = platform(cores=2.0, invoke=ExGauss(1.0, 0.1, 0.5), invoke_cpu_ms=0.8)
    truth_pf = replace(pf, background=2.0, invoke=ExGauss(2.5, 0.1, 0.5))  # 1.5 ms more per invocation
    p50 = sim_p50(plan.scaled(1.3), truth_pf, 200, 0)
    cpu = plan.scaled(1.3).total_work_ms() + 3 * pf.invoke_cpu_ms
    _, fitted_pf, fit = calibrate(plan, pf, p50_ms=p50, cpu_ms=cpu, background=2.0, method="delay")
    assert fit.weight == 1.0 and fitted_pf.background == 2.0
    assert fit.extra_delay_ms == pytest.approx(1.5, abs=0.1)
    assert sim_p50(plan.scaled(fit.compute_scale), fitted_pf, 200, 0) == pytest.approx(p50, rel=0.01)


def test_calibration_puts_cpu_the_p50_cannot_hold_beside_the_path() -> None:
    """More CPU per request than the 1-client p50 leaves room for (the truth: 4 ms per request of the
    platform's threads working beside the critical path): the fit keeps the whole CPU per request, so the
    saturated throughput of a closed loop is the truth's, where scaling the compute down would overstate it."""
    from bench.sim.calibration import calibrate, sim_p50

    plan = fork_join()
    pf = platform(cores=2.0, invoke=ExGauss(1.0, 0.1, 0.5), invoke_cpu_ms=0.8)
    truth_pf = replace(pf, offpath_cpu_ms=4.0)
    p50 = sim_p50(plan, truth_pf, 200, 0)
    cpu = plan.total_work_ms() + 3 * pf.invoke_cpu_ms + 4.0
    fitted_plan, fitted_pf, fit = calibrate(plan, pf, p50_ms=p50, cpu_ms=cpu, method="delay")
    assert fit.offpath_cpu_ms == pytest.approx(4.0, rel=0.1)
    assert fit.compute_scale == pytest.approx(1.0, rel=0.03)
    assert sim_p50(fitted_plan, fitted_pf, 200, 0) == pytest.approx(p50, rel=0.01)
    loop = {"clients": 6, "requests_per_client": 40, "warmup": 2}
    truth = simulate(plan, truth_pf, **loop).summary()["throughput_rps"]  # type: ignore[arg-type]
    assert simulate(fitted_plan, fitted_pf, **loop).summary()["throughput_rps"] == pytest.approx(truth, rel=0.03)  # type: ignore[arg-type]
    assert truth == pytest.approx(2.0 / cpu * 1e3, rel=0.03)  # the cores, saturated


def test_sim_plan_from_perf_model_choices() -> None:
    from bench.sim.plans import sim_plan_for_choices, sim_platform
    from functions.plan import Split
    from partitioner.graph import LayerGraph
    from partitioner.perfmodel import ComputeModel, PerfModel, PlatformFacts, StageChoice
    from platforms import load_profile
    from tests.onnx_builders import conv_stack

    model = conv_stack([{"op": "Conv", "k": (3, 3), "pads": [1, 1, 1, 1], "cout": 8}] * 3, cin=3, h=16, w=16)
    lg = LayerGraph.load(model)
    profile = load_profile("local")
    pm = PerfModel(lg, PlatformFacts.from_profile(profile), ComputeModel.from_flops(lg))
    n = len(lg.units)
    choices = [StageChoice(0, 0, Split("spatial", (2, 1)), True, 1769), StageChoice(1, n - 1, Split(), True, 0)]
    plan = sim_plan_for_choices(pm, choices, 1769, shared_cores=True)
    assert set(plan.functions) == {"master", "s00-p01"}
    assert plan.stages[0].workers[0].function == "s00-p01" and plan.stages[0].master_ms > 0
    assert plan.stages[1].workers == () and plan.stages[1].master_ms > 0
    pf = sim_platform(profile, cores=2.0)
    assert pf.cores == 2.0 and pf.granularity_ms == profile.billing_granularity_ms
    r = simulate(plan, pf, clients=2, requests_per_client=5)
    assert r.summary()["requests"] == 10 and r.summary()["usd_per_1000"] > 0
    lam = sim_platform(load_profile("aws-lambda"))
    assert lam.cores is None  # the cloud: every function has its own CPU


def test_validate_rejects_a_bad_stage_spec_before_deploying() -> None:
    """A typo in --stages is a usage error naming the option, not a traceback after minutes of work."""
    from click.testing import CliRunner

    from bench.commands.sim import sim_cmd

    r = CliRunner().invoke(sim_cmd, ["--validate", "--stages", "0-9:bogus=2,10-:none", "--out", "/nonexistent"])
    assert r.exit_code == 2
    assert "--stages" in r.output and "unknown split family 'bogus'" in r.output


# The key paths of `flatpack bench sim --validate --json` as the base commit printed them (function-name keys
# as "*", the machine's provenance left out); a function map that was empty there (no workers) has "*" too.
VALIDATE_KEYS = set("""
all_correct benchmark calibration calibration.alternative_fit calibration.alternative_fit.compute_scale
calibration.alternative_fit.constant calibration.alternative_fit.extra_delay_ms calibration.alternative_fit.how
calibration.alternative_fit.measured_background calibration.alternative_fit.method
calibration.alternative_fit.offpath_cpu_ms calibration.alternative_fit.weight calibration.alternative_fit.worker_scales
calibration.alternative_fit.worker_scales.* calibration.background calibration.background.constant
calibration.background.measured calibration.background.weight calibration.capacity_how calibration.capacity_rps
calibration.cold_start_ms calibration.compute_scale calibration.cores calibration.fit calibration.fit.compute_scale
calibration.fit.constant calibration.fit.extra_delay_ms calibration.fit.how calibration.fit.measured_background
calibration.fit.method calibration.fit.offpath_cpu_ms calibration.fit.weight calibration.fit.worker_scales
calibration.fit.worker_scales.* calibration.how calibration.instance_start_cpu_ms calibration.invoke
calibration.invoke.cpu_ms_per_invocation calibration.invoke.delay_fit calibration.invoke.delay_fit.mu
calibration.invoke.delay_fit.sigma calibration.invoke.delay_fit.tau calibration.invoke.instance_start_cpu_ms
calibration.invoke.mean_ms calibration.invoke.metered_ms_per_invocation calibration.invoke.n
calibration.invoke.p50_ms calibration.invoke.p99_ms calibration.invoke_cpu_ms calibration.low_load_cpu_ms_per_request
calibration.low_load_duration_ms_per_invocation calibration.low_load_duration_ms_per_invocation.live
calibration.low_load_duration_ms_per_invocation.live.* calibration.low_load_duration_ms_per_invocation.sim
calibration.low_load_duration_ms_per_invocation.sim.* calibration.low_load_machine_cpu_ms_per_request
calibration.low_load_p50_ms calibration.low_load_p95_ms calibration.low_load_p99_ms calibration.low_load_probes
calibration.low_load_probes[].background calibration.low_load_probes[].chunks
calibration.low_load_probes[].chunks[].machine_cpu_ms_per_request calibration.low_load_probes[].chunks[].p50_ms
calibration.low_load_probes[].chunks[].process_cpu_ms_per_request calibration.low_load_probes[].cpu_ms_per_request
calibration.low_load_probes[].machine_cpu_ms_per_request calibration.low_load_probes[].p50_ms
calibration.low_load_probes[].p95_ms calibration.low_load_probes[].p99_ms calibration.low_load_probes[].requests
calibration.low_load_process_cpu_ms_per_request calibration.low_load_requests calibration.low_load_sim_p50_ms
calibration.low_load_sim_p95_ms calibration.low_load_sim_p99_ms calibration.paused_p50_ms calibration.paused_think_ms
calibration.perf_model_work_ms calibration.wake_after_ms calibration.wake_ms calibration.work_cv cost_error deployment
deployment.compute_source deployment.memory_mb deployment.mode deployment.model deployment.plan machine
max_cost_error max_p50_error max_p99_error note p50_error p99_error scenarios scenarios[].alternative_calibration
scenarios[].alternative_calibration.cost_error scenarios[].alternative_calibration.method
scenarios[].alternative_calibration.p50_error scenarios[].alternative_calibration.p50_ms
scenarios[].alternative_calibration.p99_ms scenarios[].background scenarios[].background.measured_threads
scenarios[].background.simulated_threads scenarios[].cost_error scenarios[].live scenarios[].live.all_correct
scenarios[].live.billed_gb_s scenarios[].live.billed_ms_per_invocation scenarios[].live.billed_ms_per_invocation.*
scenarios[].live.cold_starts scenarios[].live.errors scenarios[].live.incorrect
scenarios[].live.machine_cpu_ms_per_request scenarios[].live.p50_ms scenarios[].live.p99_ms scenarios[].live.requests
scenarios[].live.throughput_rps scenarios[].live.usd_per_request scenarios[].name scenarios[].p50_error
scenarios[].p99_error scenarios[].sim scenarios[].sim.billed_ms_per_invocation
scenarios[].sim.billed_ms_per_invocation.* scenarios[].sim.cold_starts scenarios[].sim.cpu_utilisation
scenarios[].sim.p50_ms scenarios[].sim.p99_ms
scenarios[].sim.throughput_rps scenarios[].sim.usd_per_request scenarios[].uncalibrated_p50_error
scenarios[].uncalibrated_sim scenarios[].uncalibrated_sim.p50_ms scenarios[].uncalibrated_sim.p99_ms
scenarios[].uncalibrated_sim.usd_per_request scenarios[].warm_instances_at_start scenarios[].warm_instances_at_start.*
seconds
""".split())
_FUNCTION_MAPS = ("billed_ms_per_invocation", "warm_instances_at_start", "low_load_duration_ms_per_invocation.live",
                  "low_load_duration_ms_per_invocation.sim", "worker_scales")


def test_validation_result_prints_the_json_it_always_printed() -> None:
    """The typed validation result, made of a simulated stand-in for the live runs, turns into JSON with every
    key `bench sim --validate --json` printed before it was typed, and its figures where they were."""
    import json
    from types import SimpleNamespace

    from bench.harness.json_keys import key_paths
    from bench.load.latency import Sample, summarize
    from bench.load.run import LoadResult, LoadSpec
    from bench.load.usage import meter_delta, usage_summary
    from bench.sim.calibration import Fit
    from bench.sim.live import InvokeStats, Probe, ProbeChunk
    from bench.sim.validation import Calibration, DeploymentInfo, Scenario, ValidationResult

    plan = fork_join()
    pf = platform(cores=2.0, time_slice_ms=3.0, invoke_cpu_ms=0.5)
    sim = simulate(plan, pf, clients=2, requests_per_client=20, warmup=1).summary()
    chunk = ProbeChunk(10.0, 20.0, 21.0)
    probes = tuple(Probe([SimpleNamespace(latency_ms=10.0 + i) for i in range(20)], 20.0, 21.0,
                         {"w1": 4.0, "w2": 4.5}, 0.1, chunks=(chunk,)) for _ in range(2))
    fit = Fit("delay", 1.1, "scale from the measured CPU", weight=1.0, worker_scales={"w1": 0.9, "w2": 1.0},
              offpath_cpu_ms=0.5)
    alt = Fit("weight", 1.1, "weight fitted", weight=0.8, worker_scales={"w1": 0.9, "w2": 1.0}, offpath_cpu_ms=0.5)
    calibration = Calibration(InvokeStats(80, 1.0, 1.1, 2.0, 0.5, 120.0, 0.3, ExGauss(0.4, 0.1, 0.2)), 300.0,
                              120.0, Probe.pooled(list(probes)), probes, 12.0, 20.0, sim, pf, fit, alt, 15.0, 150.0)
    samples = [Sample(i, 0, i * 0.01, i * 0.01, 12.0, 12.0, None, True, 0.0) for i in range(10)]
    meter = {f: {"invocations": 10, "errors": 0, "cold_starts": 0, "duration_ms": 50.0, "billed_ms": 60.0,
                 "billed_gb_s": 0.1, "init_ms": 0.0, "cost_usd": 1e-6, "memory_mb": 1769, "max_rss_mb": 100.0}
             for f in plan.functions}
    live = LoadResult("validate", LoadSpec(), summarize(samples, wall_s=1.0), usage_summary(meter_delta({}, meter), 10),
                      summarize(samples[:2], wall_s=0.1), 0, samples, machine={})
    scenarios = tuple(Scenario(name, 0.1, 0.1, live, sim, sim, ("weight", sim), 30.0, dict.fromkeys(plan.functions, 1))
                      for name in ("closed loop 3 x 10", "Poisson 5/s"))
    result = ValidationResult({"cores": 2}, DeploymentInfo("vgg16 width/2 96px", "lo", 1769, ("0-:none",), "given"),
                              calibration, scenarios, 1.0)
    doc = json.loads(json.dumps(result.to_json(), default=str))
    assert {p for p in key_paths(doc, maps=_FUNCTION_MAPS) if not p.startswith("machine.")} == VALIDATE_KEYS
    assert doc["benchmark"] == "sim-validate" and doc["all_correct"] is True
    assert doc["p50_error"] == doc["scenarios"][0]["p50_error"] == pytest.approx(abs(sim["p50_ms"] - 12.0) / 12.0)
    assert doc["cost_error"] == pytest.approx(abs(sim["usd_per_1000"] / 1000 - 3e-7) / 3e-7)
    assert doc["calibration"]["fit"]["worker_scales"] == {"w1": 0.9, "w2": 1.0}
    assert doc["calibration"]["background"] == {"measured": pytest.approx(0.1), "weight": 1.0, "constant": 0.0}
    assert doc["calibration"]["low_load_requests"] == 40 and len(doc["calibration"]["low_load_probes"]) == 2

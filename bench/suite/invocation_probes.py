"""Calibrate's dispatch probes timed in a comparison's own rounds, beside the plans it compares.

A master's CPU per worker it invokes (its dispatch: the event, the invoke request, reading the reply) is a
fraction of a millisecond, and a master below one vCPU pays it at its share: a 128 MB master (0.072 vCPU)
that invokes two workers spends some 3 ms of CPU on its own work and takes 40 ms to do it. On a 2-core VM
that fraction drifts with the machine's state by more than a model may be off: on one AMD EPYC, within
half an hour of an idle machine, calibrate's dispatch went from 0.05 to 0.18 ms at one vCPU and from 0.18
to 0.30 ms at 512 MB; and calibrate measures it down to 512 MB, where a uniform plan's master has 128. A
plan whose bill is mostly that work (a millisecond model split, its master at 128 MB) is then mispriced by
a fifth whichever calibration priced it. So a benchmark that compares predictions with runs times it where
it times the runs: calibrate's own fork probes (``serving.calibrate.probes``) of 2 and of 4 workers,
deployed beside the plans at one vCPU and at each size below it where a plan's master invokes workers,
called in the same interleaved rounds with their own input. The master's median CPU per request
(``stage0_cpu_ms``) grows by one invocation's per worker, as calibrate takes it
(``serving.calibrate.measure.measure_dispatch``); the facts the rows are predicted with take these in place
of calibrate's dispatch (the plans stay those made before the rounds).

Calibrate's other per-invocation figure, a function's CPU per invocation it serves (a no-op at 512 MB
against one vCPU), is not timed again so: a no-op at 128 MB against one vCPU in the rounds put it at
0.56 ms where calibrate had 0.35, and with it the plans' 128 MB workers were priced 40 % over their bills,
which calibrate's figure priced within 13 %. What a no-op's round trip below one vCPU adds is not all the
CPU a worker spends per invocation.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import numpy as np

__all__ = ["PROBE", "InRunDispatch", "ProbeTarget", "deploy_probes", "in_run_dispatch", "probe_sizes"]

#: the probes' target names: ``probe-fork<N>-<MB>``
PROBE = "probe-"


class ProbeTarget:
    """A deployment called with its own input, whatever the round's (an interleaved comparison sends every
    target the same inputs; a probe takes its own). Its answers are the probe's, not the model's."""

    def __init__(self, inner: Any, inputs: Mapping[str, np.ndarray]) -> None:
        self.inner = inner
        self.name = inner.name
        self._inputs = dict(inputs)

    @property
    def timings(self) -> list[dict[str, float]]:
        return cast(list[dict[str, float]], self.inner.timings)

    def infer(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        return self.inner.infer(self._inputs)

    def usage(self) -> dict[str, dict[str, Any]]:
        return dict(self.inner.usage())

    def close(self) -> None:
        self.inner.close()


def probe_sizes(pm: Any, plans: Mapping[str, tuple[Sequence[Any], int]]) -> list[int]:
    """The master memories below one vCPU at which a plan of ``plans`` invokes workers, where CPU follows
    memory (none where it is per function: every master there has the CPU it is given)."""
    if pm.cpu.per_function:
        return []
    return sorted({mb for choices, mb in plans.values()
                   if pm.function_vcpu(mb) < 1.0 - 1e-9 and any(c.worker_mb for c in choices)})


def deploy_probes(st: Any, pm: Any, sizes: Sequence[int], workdir: Path) -> dict[str, ProbeTarget]:
    """The fork probes for ``sizes`` and one vCPU, deployed by ``st`` (``bench.suite.deployments``), by target
    name; none where ``sizes`` is empty."""
    from serving.calibrate.probes import FORK_SPLITS, fork_model, write_fork_bundle

    if not sizes:
        return {}
    model = fork_model()
    shape = [int(d.dim_value) for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    out: dict[str, ProbeTarget] = {}
    for mb in (pm.platform.one_vcpu_mb, *sizes):
        for n in FORK_SPLITS:
            name = f"{PROBE}fork{n}-{mb}"
            bundle = write_fork_bundle(workdir / name, model, n, memory_mb=mb)
            out[name] = ProbeTarget(st.deploy(bundle, name, keep_timings=True), x)
    return out


@dataclass(frozen=True)
class InRunDispatch:
    """The master's CPU per worker invocation the probes timed in the rounds (ms), by master memory."""

    dispatch_ms: dict[int, float]

    def facts(self, platform: Any) -> Any:
        """``platform`` (``PlatformFacts``) with these in place of calibrate's dispatch."""
        points = tuple(sorted((min(1.0, mb / platform.mb_per_vcpu), ms) for mb, ms in self.dispatch_ms.items()))
        return replace(platform, dispatch=points)

    def note(self, calibrated: Any) -> str:
        """What replaced what (``calibrated``: the facts calibrate gave)."""
        was = ", ".join(f"{round(v * calibrated.mb_per_vcpu)} MB {ms:.3f}" for v, ms in calibrated.dispatch)
        now = ", ".join(f"{mb} MB {ms:.3f}" for mb, ms in sorted(self.dispatch_ms.items()))
        return (f"; priced with the master's CPU per worker invocation timed in these rounds (calibrate's fork "
                f"probes beside the plans): {now} ms" + (f" (calibrate: {was})" if was else ""))


def in_run_dispatch(probes: Mapping[str, Any], *, transfer_latency_ms: float, rounds: int) -> InRunDispatch | None:
    """The probes' figures over the measured ``rounds`` (see the module docstring); None where there were no
    probes or one answered fewer than 3 of them."""
    from serving.calibrate.measure import dispatch_ms
    from serving.calibrate.probes import FORK_SPLITS

    sizes = sorted({int(k.rsplit("-", 1)[1]) for k in probes})
    dispatch: dict[int, float] = {}
    for mb in sizes:
        med = {}
        for n in FORK_SPLITS:
            cpu = [t["stage0_cpu_ms"] for t in probes[f"{PROBE}fork{n}-{mb}"].timings[-rounds:]
                   if "stage0_cpu_ms" in t]
            if len(cpu) < 3:
                return None
            med[n] = statistics.median(cpu)
        dispatch[mb] = dispatch_ms(med, transfer_latency_ms)
    return InRunDispatch(dispatch) if dispatch else None

"""``flatpack demo``: the product's promise on this machine, end to end.

A model that one small function serves too slowly is deployed as the cheapest plan that meets an SLO, beside
the same model in one function of the same memory; both are sent the same requests, in alternating blocks,
and the live latencies are printed side by side.

The SLO is set from this machine's own figures, not a constant: what one function takes depends on the CPU
(a 512 MB function gets 0.29 of a core here as on Lambda, but a core of one machine computes twice as fast as
another's). The demo deploys the unsplit function first and times it, predicts the fastest plan as deploy
will plan it, and asks for an SLO between the two, nearer the unsplit function's (:func:`demo_slo_ms`): one
function misses it as measured, not as predicted.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path

import click
import numpy as np

from serving.console import console, status

__all__ = ["demo_cmd", "demo_slo_ms"]


def demo_slo_ms(unsplit_ms: float, fastest_ms: float) -> float | None:
    """The SLO the demo asks for: a fifth of the way from the unsplit function's latency (measured) to the
    fastest plan's, in ratio (``unsplit**0.8 * fastest**0.2``), rounded down to 5 ms (to 1 ms where 5 would
    reach the fastest plan's); None where splitting gains less than 10 % (no SLO separates them). One
    function misses it by 11-20 % where the fastest plan is 1.7-2.5x faster. The fastest plan's prediction is
    the model's least sure (the most functions, sharing the machine's cores): an SLO nearer to it would ask
    the live check for the plans whose live figures stray most, and leave it the least room to correct them
    (``deploy`` checks the plan live and corrects it)."""
    if not (unsplit_ms > 0 and fastest_ms > 0) or fastest_ms > unsplit_ms / 1.1:
        return None
    between = unsplit_ms ** 0.8 * fastest_ms ** 0.2
    rounded = 5.0 * math.floor(between / 5.0)
    return rounded if rounded > fastest_ms else float(math.floor(between))


def _flatpack(args: list[str]) -> None:
    """Run ``flatpack ARGS`` as the user would (echoed first); its failure ends the demo with its exit code."""
    console.print(f"[bold]$ flatpack {' '.join(args)}[/]")
    rc = subprocess.call([sys.executable, "-m", "serving.cli", *args])  # noqa: S603 - this program, our arguments
    if rc != 0:
        raise click.exceptions.Exit(rc)


@click.command("demo")
@click.option("--model", default="vgg16", show_default=True, help="Zoo model.")
@click.option("--width-div", type=int, default=2, show_default=True, help="Divide every layer's width by this.")
@click.option("--input-size", type=int, default=224, show_default=True, help="Input height and width.")
@click.option("--memory", type=click.IntRange(128, 10240), default=512, show_default=True,
              help="Memory of every function (MB); the local platform gives it memory/1769 of a core.")
@click.option("--slo", default="auto", show_default=True,
              help="SLO of the split plan (e.g. 90ms); auto: between the unsplit function and the fastest plan.")
@click.option("--port", type=int, default=8080, show_default=True,
              help="Port of the split plan's endpoint; the unsplit function's is the next one.")
@click.option("--requests", type=click.IntRange(3, 10_000), default=40, show_default=True,
              help="Requests to each endpoint (interleaved).")
def demo_cmd(model: str, width_div: int, input_size: int, memory: int, slo: str, port: int, requests: int) -> None:
    """Deploy a model split across functions to meet an SLO one function misses, beside the unsplit function,
    and print both live latencies. Both keep serving afterwards (flatpack ls; flatpack undeploy NAME)."""
    from partitioner.graph import LayerGraph
    from partitioner.perfmodel import StageChoice
    from partitioner.spec import Split
    from serving.cli.deploy import calibrated_local
    from serving.cli.models import parse_duration_ms
    from serving.cli.plan import request_from
    from zoo.cache import zoo_file
    from zoo.errors import ZooError

    split_name, unsplit_name = f"{model}-split", f"{model}-unsplit"
    build = Path("build")
    try:
        with status(f"building {model} (width/{width_div}, {input_size} px; once, then cached)"):
            path = zoo_file(model, width_div=width_div, input_size=input_size)
    except (ZooError, ImportError) as e:
        raise click.ClickException(str(e)) from e
    platform = calibrated_local(False)
    request = request_from("lo", None, None, None, platform, str(memory), None, "shm", "auto")
    lg = LayerGraph.load(path)
    with status("predicting the unsplit function and the fastest plan") as say:
        from partitioner.planner import make_perfmodel
        from serving.calibrate.stages import solve_on_target

        pm, _, _ = make_perfmodel(lg, request, progress=say)
        # as deploy predicts them: unit times scaled to the model in a function here, what live checks of earlier
        # deployments measured, the plan's stages timed (and cached for the deploy below)
        fastest_ms = solve_on_target(lg, request, pm, progress=say)[0].estimate.latency_ms
        whole = [StageChoice(0, len(lg.units) - 1, Split("none", (1,)), True, 0)]
        unsplit_ms = pm.estimate(whole, memory).latency_ms
    console.print(f"{model} (width/{width_div}, {input_size} px) at {memory} MB per function, predicted: one "
                  f"function {unsplit_ms:.0f} ms, the fastest plan {fastest_ms:.0f} ms")
    for name in (split_name, unsplit_name):
        subprocess.call([sys.executable, "-m", "serving.cli", "undeploy", name],  # noqa: S603 - as above
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # the unsplit function first: the split plan's live check then runs on the machine as the comparison will,
    # and the SLO stands between what one function takes here, measured, and the fastest plan's prediction
    _flatpack(["export", str(path), "--stages", "0-:none", "--memory", str(memory), "-o",
               str(build / unsplit_name)])
    _flatpack(["serve", str(build / unsplit_name), "--name", unsplit_name, "--port", str(port + 1), "--detach"])
    from partitioner.inputs import random_inputs

    inputs = random_inputs(lg.model, 0)
    if slo == "auto":
        from functions.settings import api_token
        from serving.deploy.promise import EndpointProbe
        from serving.deploy.state import DeploymentRecord

        with status("timing the unsplit function"):
            probe = EndpointProbe(DeploymentRecord.load(unsplit_name).endpoint or "", unsplit_name, lg.model,
                                  token=api_token(), warmup=1)
            try:
                unsplit_live = float(np.mean(probe(20).latencies_ms))
            finally:
                probe.close()
        slo_ms_or_none = demo_slo_ms(unsplit_live, fastest_ms)
        if slo_ms_or_none is None:
            _flatpack(["undeploy", unsplit_name])
            raise click.ClickException(
                f"splitting {model} gains too little at {memory} MB on this machine for an SLO to separate the "
                f"plans (one function {unsplit_live:.0f} ms live, the fastest plan {fastest_ms:.0f} ms "
                "predicted); try a smaller --memory or a larger --input-size")
        slo_ms = slo_ms_or_none
        console.print(f"one function takes {unsplit_live:.0f} ms here (20 requests); asking for an SLO of "
                      f"{slo_ms:.0f} ms: one function misses it, a split plan can meet it")
    else:
        slo_ms = parse_duration_ms(slo)
    _flatpack(["deploy", str(path), "--mode", "slo", "--slo", f"{slo_ms:g}ms", "--memory", str(memory),
               "--name", split_name, "--port", str(port), "--detach"])
    _compare(split_name, unsplit_name, slo_ms, requests, inputs, unsplit_ms)
    console.print(f"both keep serving (flatpack ls); stop them with: flatpack undeploy {split_name}; "
                  f"flatpack undeploy {unsplit_name}")


#: requests to one deployment before the other takes its turn
_BLOCK = 10


def _compare(split_name: str, unsplit_name: str, slo_ms: float, requests: int,
             inputs: dict[str, np.ndarray], unsplit_predicted_ms: float) -> None:
    """Send both deployments the same requests in alternating blocks and print their live figures side by side.

    Blocks of :data:`_BLOCK` requests, the deployments taking turns, so that a drift of the machine's speed
    moves both alike; the first request of each block is not counted, as it finds the caches full of the other
    deployment's weights (a client of one endpoint does not pay that)."""
    from rich.table import Table

    from serving.api.client import InferClient
    from serving.deploy.state import DeploymentRecord

    records = {n: DeploymentRecord.load(n) for n in (split_name, unsplit_name)}
    times: dict[str, list[float]] = {n: [] for n in records}
    clients = {n: InferClient(r.endpoint or "", n, timeout_s=120.0) for n, r in records.items()}
    try:
        with status("sending requests to both") as say:
            block = 0
            while min(len(t) for t in times.values()) < requests:
                order = list(clients.items()) if block % 2 == 0 else list(reversed(clients.items()))
                for n, c in order:
                    c.infer(inputs)  # the caches, refilled with this deployment's weights: not counted
                    for _ in range(min(_BLOCK, requests - len(times[n]))):
                        t0 = time.perf_counter()
                        c.infer(inputs)
                        times[n].append((time.perf_counter() - t0) * 1e3)
                block += 1
                say(f"{min(len(t) for t in times.values())}/{requests} each")
    finally:
        for c in clients.values():
            c.close()
    p50 = {n: float(np.median(t)) for n, t in times.items()}
    mean = {n: float(np.mean(t)) for n, t in times.items()}
    predicted = {split_name: float(records[split_name].predicted.get("latency_ms") or 0.0),
                 unsplit_name: unsplit_predicted_ms}
    promise = records[split_name].options.get("promise") or {}
    t = Table(title=f"the SLO {slo_ms:g} ms on the mean; live over {requests} requests each")
    for col in ("deployment", "functions", "predicted ms", "live mean ms", "live p50 ms", "mean / SLO", "SLO met"):
        t.add_column(col, justify="left" if col == "deployment" else "right")
    for n, r in records.items():
        met = mean[n] <= slo_ms
        t.add_row(n, str(len(r.functions)), f"{predicted[n]:.1f}" if predicted[n] else "-", f"{mean[n]:.1f}",
                  f"{p50[n]:.1f}", f"{mean[n] / slo_ms:.2f}", "[green]yes[/]" if met else "[red]no[/]")
    console.print(t)
    if promise:
        console.print(f"deploy checked the split plan live before it returned: {promise.get('rounds')} round(s), "
                      f"mean {promise.get('live_ms', float('nan')):.1f} ms against the SLO")
    console.print(f"the split plan answers {p50[unsplit_name] / p50[split_name]:.2f}x faster than one function "
                  "of the same memory, at the cheapest cost that meets the SLO live.")

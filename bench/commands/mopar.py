"""``flatpack bench mopar``: MOPAR vs Unsplit vs Uniform, live (:mod:`bench.suite.mopar_live`)."""

from __future__ import annotations

from pathlib import Path

import click

from bench.commands.lo import _spec
from bench.commands.output import emit

__all__ = ["mopar_cmd"]


@click.command("mopar")
@click.option("--model", "models", multiple=True, help="NAME[/wDIV][@SIZE]; repeat (default: vgg16/w2@224, "
              "resnet50@224, lstm-2/w2, bert/w2, gcn/w4, and dlrm where CPU follows memory).")
@click.option("--platform", "platform", default="local", show_default=True,
              help="The platform the local platform emulates, by profile name: local (Lambda's CPU model, CPU "
                   "follows memory) or openfaas (CPU per function, apart from memory: MOPAR's testbed).")
@click.option("--rounds", type=int, default=None,
              help="Interleaved requests per plan, at least (default: 60 where CPU is per function; 20 where it "
                   "follows memory, whose 128 MB functions take seconds a request). A fast model gets more, up "
                   "to 10x, until its requests add up to 3 s, and then more, up to 10x in all, until every "
                   "plan's mean request is known within 2 % (relative standard error): MC is a mean of billed "
                   "times, and on a shared host the odd request that waits out a busy moment moves a short "
                   "run's mean.")
@click.option("--epochs", type=click.IntRange(min=1), default=3, show_default=True,
              help="Run the rounds in this many epochs, each on fresh instances (new processes) of every function, "
                   "and any rounds added for precision in one more each: two processes of one function differ "
                   "in speed by a few per cent that stays with the process, so each plan's MC is a mean over "
                   "several.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Each round sends its requests to the plans, the reference and the probes in an order drawn "
                   "afresh from a generator seeded with this (recorded in the JSON): no deployment always follows "
                   "the same one, whose leftovers (caches, a process back from idle) it would then always meet.")
@click.option("--quick", is_flag=True, help="A tiny run: vgg16/w8@64 (unless --model is given), 5 rounds (a fast "
              "model more, as --rounds says).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also save the JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def mopar_cmd(models: tuple[str, ...], platform: str, rounds: int | None, epochs: int, seed: int, quick: bool,
              out: Path | None, as_json: bool) -> None:
    """MOPAR's plan against Unsplit and Uniform slicing, live on the local platform with each function's CPU
    emulated as --platform sells it: billed GB-s per request (MC), memory utilisation and p50, with the MC the
    plan predicted."""
    from bench.harness.provenance import machine
    from bench.suite.mopar_live import QUICK_MODELS, default_models, rows, targets
    from platforms import load_profile
    from serving.console import status

    if rounds is not None and rounds < 1:
        raise click.BadParameter(f"{rounds}: give at least 1 round", param_hint="--rounds")
    try:
        per_function = load_profile(platform).cpu.per_function
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--platform") from e
    if rounds is None:
        rounds = 60 if per_function else 20
    specs = tuple(_spec(m) for m in models) or (QUICK_MODELS if quick else default_models(platform))
    n = min(rounds, 5) if quick else rounds
    with status("bench mopar") as say:
        result, cpu = rows(specs, rounds=n, say=say, platform=platform, epochs=epochs, seed=seed)
    doc = {"page": "mopar" if platform == "local" else f"mopar-{platform}", "platform": platform,
           "cpu_model": cpu.get("cpu_model", "follows_memory"), "cpu_limit": cpu.get("cpu_limit"),
           "cpu": cpu, "machine": machine(), "rounds": n, "epochs": epochs, "seed": seed,
           "rows": [r.to_json() for r in result],
           "targets": [t.to_json() for t in targets(result, per_function=per_function)]}
    if emit(doc, out=out, as_json=as_json):
        return
    from rich.table import Table

    from serving.console import console

    t = Table(title=f"MOPAR vs Unsplit vs Uniform, live on the local platform emulating {platform} "
                    f"({cpu.get('cpu_model', 'follows_memory')}, {cpu.get('cpu_limit')}), {n} rounds")
    for c in ("model", "plan", "slices", "functions", "MC GB-s", "predicted", "memory util.", "p50 ms"):
        t.add_column(c, justify="left" if c in ("model", "plan") else "right")
    for r in result:
        t.add_row(r.model, r.plan, str(r.slices), str(r.functions), f"{r.mc_gb_s:.5f}", f"{r.predicted_mc_gb_s:.5f}",
                  f"{r.memory_utilisation:.0%}", f"{r.p50_ms:.1f}")
    console.print(t)
    checks = Table(title="targets")
    for c in ("target", "pass", "detail"):
        checks.add_column(c)
    for x in doc["targets"]:
        checks.add_row(x["target"], "yes" if x["pass"] else "[red]no[/]", x["detail"])
    console.print(checks)

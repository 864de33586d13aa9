"""``flatpack bench embedding``: an embedding split's parts against the whole lookup stage
(:mod:`bench.components.embedding_parts`)."""

from __future__ import annotations

from pathlib import Path

import click

from bench.commands.output import emit
from bench.components.embedding_parts import EmbeddingPartsResult, measure

__all__ = ["embedding_cmd"]


def _print(result: EmbeddingPartsResult) -> None:
    from rich.table import Table

    from serving.console import console

    t = Table(title=f"{result.model}, unit {result.unit}: each part against the whole lookup stage "
                    f"({result.whole_p50_ms:.2f} ms), one thread, median of {result.rounds}")
    for c in ("split", "part", "median ms", "x whole", "modelled x whole", "model's error"):
        t.add_column(c, justify="right")
    for r in result.rows:
        t.add_row(f"embedding={r.degree}", str(r.part), f"{r.p50_ms:.3f}", f"{r.ratio:.2f}", f"{r.modelled_ratio:.2f}",
                  f"{r.error:+.1%}")
    console.print(t)


@click.command("embedding")
@click.argument("model", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--candidates", type=click.IntRange(min=1), default=256, show_default=True,
              help="Without MODEL: the zoo's DLRM scoring this many candidates a request (its batch).")
@click.option("--degree", "degrees", type=click.IntRange(min=2), multiple=True, default=(2, 4), show_default=True,
              help="Parts of the split; repeat.")
@click.option("--rounds", type=click.IntRange(min=3), default=40, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also save the JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def embedding_cmd(model: Path | None, candidates: int, degrees: tuple[int, ...], rounds: int, out: Path | None,
                  as_json: bool) -> None:
    """Time the parts of an embedding split (MODEL, default: the zoo's DLRM, 2 GB of tables) against the
    whole stage of lookups, and the ratio the performance model prices each at."""
    from partitioner.graph import LayerGraph
    from serving.console import err_console
    from zoo.cache import zoo_file

    def say(m: str) -> None:
        err_console.print(f"[dim]{m}[/]")

    path = model or zoo_file("dlrm", input_size=candidates)
    try:
        result = measure(LayerGraph.load(path), degrees=degrees, rounds=rounds, progress=say)
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    if not emit(result.to_json(), out=out, as_json=as_json):
        _print(result)

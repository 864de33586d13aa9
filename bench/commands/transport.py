"""``flatpack bench transport``: put+get throughput of each transport vs memcpy (:mod:`bench.components.transport`)."""

from __future__ import annotations

from pathlib import Path

import click

from bench.commands.output import emit
from bench.components.transport import SIZES, TransportResult, measure

__all__ = ["transport_cmd"]


def _size(n: int) -> str:
    return f"{n >> 20} MB" if n >= 1 << 20 else f"{n >> 10} KB"


def _print(result: TransportResult) -> None:
    from rich.table import Table

    from serving.console import console

    t = Table(title="transport put+get throughput (MB/s = 1e6 bytes/s; ratio to memcpy in the same run)")
    names = list(dict.fromkeys(r.transport for r in result.rows))
    t.add_column("size", justify="right")
    for n in names:
        t.add_column(n, justify="right")
    for size in dict.fromkeys(r.bytes for r in result.rows):
        cells = []
        for n in names:
            r = next(r for r in result.rows if r.transport == n and r.bytes == size)
            cell = f"{r.mb_s:.0f}" if n == "memcpy" else f"{r.mb_s:.0f} ({r.ratio_to_memcpy:.2f}x)"
            cells.append(cell + (f" [{r.errors} err]" if r.errors else ""))
        t.add_row(_size(size), *cells)
    console.print(t)
    for name, why in result.skipped.items():
        console.print(f"[yellow]skipped {name}[/]: {why}")


@click.command("transport")
@click.option("--sizes", default=None, help="Comma-separated tensor sizes in KB (default 64..65536).")
@click.option("--redis-url", envvar="FLATPACK_REDIS_URL", default="redis://127.0.0.1:6379/0", show_default=True)
@click.option("--no-redis", is_flag=True, help="Leave Redis out.")
@click.option("--s3", is_flag=True, help="Include S3 (on moto's local server).")
@click.option("--min-time-s", type=float, default=0.3, show_default=True, help="Time spent per row, at least.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also save the JSON (with config and git revision) here.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def transport_cmd(sizes: str | None, redis_url: str, no_redis: bool, s3: bool, min_time_s: float, out: Path | None,
                  as_json: bool) -> None:
    """Put+get throughput of each transport (64 KB-64 MB) and its ratio to memcpy, measured in one run."""
    try:
        size_list = tuple(int(s) << 10 for s in sizes.split(",")) if sizes else SIZES
    except ValueError as e:
        raise click.BadParameter(f"{sizes!r}: give sizes in KB, e.g. 64,4096") from e
    result = measure(size_list, redis_url=None if no_redis else redis_url, s3=s3, min_time_s=min_time_s)
    if not emit(result.to_json(), out=out, as_json=as_json):
        _print(result)

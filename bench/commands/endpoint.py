"""``flatpack bench endpoint``: HTTP inference latency vs onnxruntime in-process (:mod:`bench.components.endpoint`)."""

from __future__ import annotations

import click

from bench.commands.output import echo_json
from bench.components.endpoint import EndpointResult, measure_endpoint

__all__ = ["endpoint_cmd"]


def _print(result: EndpointResult) -> None:
    from rich.table import Table

    from serving.console import console

    base = result.baseline_p50_ms
    table = Table(title=f"endpoint overhead, {result.model}")
    for col in ("path", "p50 ms", "p99 ms", "x onnxruntime", "+ms", "target p50 ms"):
        table.add_column(col)
    for k in result.latency_ms:
        target = "" if k == "onnxruntime" else f"{result.target_ms(k):.2f}"
        table.add_row(k, f"{result.p50(k):.2f}", f"{result.p99(k):.2f}", f"{result.p50(k) / base:.2f}",
                      f"{result.p50(k) - base:.2f}", target)
    console.print(table)
    console.print(f"requests/s at 8 clients: {dict(result.requests_per_s)}; errors {result.errors}, "
                  f"wrong outputs {result.wrong_outputs}")


@click.command("endpoint")
@click.option("--json", "as_json", is_flag=True)
@click.option("--requests", "n", default=500, show_default=True,
              help="Timed requests per path (p50 of 500 moves by a few hundredths of a ms between runs).")
@click.option("--model", default="resnet18", show_default=True, help="Zoo model (small variant).")
def endpoint_cmd(as_json: bool, n: int, model: str) -> None:
    """Endpoint overhead vs onnxruntime in-process, binary and JSON tensors (target: p50 <= 1.10x + 1 ms
    binary, + 2 ms JSON) and requests/s."""
    from serving.console import err_console

    result = measure_endpoint(n=n, model=model, say=lambda m: err_console.print(f"[dim]{m}[/]"))
    if as_json:
        echo_json(result.to_json(), default=None)
        return
    _print(result)

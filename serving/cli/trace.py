"""`flatpack trace NAME`: the waterfall of a deployment's recent requests, from its endpoint.

The endpoint keeps the last requests' traces (``GET /v2/models/{name}/traces?last=N``; spans per stage and
part, :mod:`functions.trace`); this command draws them as text, as a PNG (``--png``, with matplotlib: the
``plot`` extra), or prints them as JSON (``--json``).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import click
from rich.table import Table

from functions.settings import api_token
from functions.trace import CATEGORIES, CONTAINERS, RequestTrace, Span, category_of
from serving.console import console

__all__ = ["draw_png", "fetch_traces", "trace_cmd"]

_COLOURS = {"compute": "#2ca02c", "communication": "#1f77b4", "dispatch": "#ff7f0e", "waiting": "#d62728",
            "frame": "#c7c7c7"}
_RICH = {"compute": "green", "communication": "blue", "dispatch": "yellow", "waiting": "red", "frame": "bright_black"}


def fetch_traces(endpoint: str, model: str, last: int, *, token: str | None = None, timeout_s: float = 30.0
                 ) -> list[RequestTrace]:
    """The last ``last`` request traces of ``model`` at ``endpoint`` (oldest first).

    Raises click.ClickException naming the endpoint where it cannot be read.
    """
    url = f"{endpoint.rstrip('/')}/v2/models/{model}/traces?last={int(last)}"
    token = token or api_token()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(url, headers=headers)  # noqa: S310 - the deployment's own endpoint URL
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:  # noqa: S310 - http(s) only, from the record
            doc = json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise click.ClickException(f"{url} answered {e.code}: {e.read().decode(errors='replace')[:300]}"
                                   f"{' (set FLATPACK_API_TOKEN)' if e.code == 401 else ''}") from e
    except (urllib.error.URLError, OSError) as e:
        raise click.ClickException(f"cannot read traces from {url}: {e}; is the deployment running "
                                   "(`flatpack status`)?") from e
    try:
        return [RequestTrace.from_json(t) for t in doc["requests"]]
    except (KeyError, TypeError, ValueError) as e:
        raise click.ClickException(f"{url} answered something that is not a trace list: {e}") from e


def _label(s: Span) -> str:
    where = "" if s.stage is None else f"s{s.stage}" + ("" if s.part is None else f" p{s.part}")
    return f"{where} {s.name}".strip()


def _kind(s: Span) -> str:
    return "frame" if s.name in CONTAINERS else category_of(s.name)


def _ordered(spans: tuple[Span, ...]) -> list[Span]:
    """Frames before what they hold; otherwise by start."""
    return sorted(spans, key=lambda s: (s.start_ms, s.name not in CONTAINERS, -(s.end_ms - s.start_ms)))


def print_waterfall(trace: RequestTrace, *, width: int = 48) -> None:
    lat = max(trace.latency_ms, 1e-9)
    table = Table(title=f"{trace.model}: {trace.latency_ms:.2f} ms", title_justify="left")
    table.add_column("span")
    table.add_column("start ms", justify="right")
    table.add_column("ms", justify="right")
    table.add_column("")
    for s in _ordered(trace.spans):
        a = min(width - 1, round(width * s.start_ms / lat))
        n = max(1, round(width * (s.end_ms - s.start_ms) / lat))
        bar = " " * a + "█" * min(n, width - a)
        table.add_row(_label(s), f"{s.start_ms:.2f}", f"{s.end_ms - s.start_ms:.2f}", f"[{_RICH[_kind(s)]}]{bar}[/]")
    console.print(table)
    b = trace.to_json()["breakdown"]
    console.print("  " + ", ".join(f"{c} {b[f'{c}_ms']:.2f} ms ({100 * b[f'{c}_ms'] / lat:.0f} %)"
                                   for c in CATEGORIES))


def draw_png(trace: RequestTrace, path: str | Path) -> Path:
    """The waterfall of ``trace`` as a PNG at ``path``: a bar per span, coloured by what it counts as."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as e:
        raise click.ClickException(f"--png needs matplotlib: pip install -e '.[plot]' ({e})") from e
    spans = _ordered(trace.spans)
    fig, ax = plt.subplots(figsize=(10, 0.6 + 0.25 * len(spans)))
    try:
        for row, s in enumerate(spans):
            ax.barh(row, s.end_ms - s.start_ms, left=s.start_ms, height=0.7, color=_COLOURS[_kind(s)])
        ax.set_yticks(range(len(spans)), [_label(s) for s in spans], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("ms from the request's start")
        ax.set_title(f"{trace.model}: {trace.latency_ms:.2f} ms")
        ax.legend(handles=[Patch(color=c, label=k) for k, c in _COLOURS.items()], fontsize=7, ncol=5,
                  loc="upper center", bbox_to_anchor=(0.5, -0.6 / max(4, len(spans))))
        fig.tight_layout()
        out = Path(path)
        fig.savefig(out, format="png", dpi=110)
    finally:
        plt.close(fig)
    return out


@click.command("trace")
@click.argument("name")
@click.option("--last", type=click.IntRange(1, 10_000), default=1, show_default=True,
              help="How many of the most recent requests.")
@click.option("--json", "as_json", is_flag=True, help="Print the traces as JSON.")
@click.option("--png", type=click.Path(dir_okay=False), default=None,
              help="Also draw the most recent request's waterfall into this PNG file.")
def trace_cmd(name: str, last: int, as_json: bool, png: str | None) -> None:
    """The waterfall of a deployment's recent requests: a span per stage and per part (invoke, cold start,
    read, compute, write, reply, join) and the endpoint's own (decode, encode), with where the time went."""
    from serving.deploy.state import DeploymentRecord

    try:
        record = DeploymentRecord.load(name)
    except LookupError as e:
        raise click.ClickException(str(e)) from e
    if not record.endpoint or not record.running():
        raise click.ClickException(f"deployment {name!r} is not running (status {record.status}); its traces live "
                                   "in its endpoint's memory")
    traces = fetch_traces(record.endpoint, record.name, last)
    if png is not None:
        if not traces:
            raise click.ClickException(f"deployment {name!r} has answered no request yet: nothing to draw")
        draw_png(traces[-1], png)
    if as_json:
        click.echo(json.dumps({"requests": [t.to_json() for t in traces]}, indent=1))
        return
    if not traces:
        console.print(f"{name}: no request answered yet")
    for t in traces:
        print_waterfall(t)
    if png is not None:
        console.print(f"waterfall written to {png}")

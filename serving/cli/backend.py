"""`flatpack backend setup|status`: the environments of part-execution backends other than onnxruntime."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.table import Table

from serving.console import console, err_console

__all__ = ["backend"]


@click.group("backend")
def backend() -> None:
    """Part-execution backends: onnxruntime (default, flatpack's own environment) and mxnet (its own)."""


@backend.command("setup")
@click.argument("name", type=click.Choice(["mxnet"]))
@click.option("--json", "as_json", is_flag=True, help="Print where it is as JSON.")
def setup_cmd(name: str, as_json: bool) -> None:
    """Create (once) and cache the virtual environment NAME's functions run in."""
    from serving.platform.runtimes import BackendEnvError, ensure_backend_env

    try:
        env = ensure_backend_env(name, progress=lambda m: err_console.print(f"[dim]{m}[/]"))
    except (BackendEnvError, ValueError) as e:
        raise click.ClickException(str(e)) from e
    if as_json:
        click.echo(json.dumps(env.describe()))
    else:
        console.print(f"[green]{name}[/] environment ready: {env.root}")


@backend.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status_cmd(as_json: bool) -> None:
    """Which backends are ready to run functions, and where their environments are."""
    import sys

    from serving.platform.runtimes import backend_env

    rows = [{"backend": "onnxruntime", "path": sys.prefix, "ready": True, "python": sys.executable,
             "requirements": []}, backend_env("mxnet").describe()]
    if as_json:
        click.echo(json.dumps(rows))
        return
    t = Table(title="part-execution backends")
    for c in ("backend", "ready", "environment"):
        t.add_column(c)
    for r in rows:
        t.add_row(str(r["backend"]), "yes" if r["ready"] else "no (flatpack backend setup mxnet)", str(r["path"]))
    console.print(t)


def require_backend(backend: str, *, bundle: Path | None = None, quiet: bool = False, local: bool = True) -> None:
    """:func:`serving.platform.runtimes.require_backend` for a command: progress on stderr, a problem as a
    one-line ``ClickException``."""
    from serving.platform.runtimes import BackendEnvError
    from serving.platform.runtimes import require_backend as require

    try:
        require(backend, bundle=bundle, local=local, notice=err_console.print,
                progress=None if quiet else (lambda m: err_console.print(f"[dim]{m}[/]")))
    except BackendEnvError as e:
        raise click.ClickException(str(e)) from e

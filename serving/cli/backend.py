"""`flatpack backend setup|status`: the environments of part-execution backends other than onnxruntime."""

from __future__ import annotations

import json

import click
from rich.table import Table

from serving.cli.console import console, err_console

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


def require_backend(backend: str, *, bundle: object = None, quiet: bool = False, local: bool = True) -> None:
    """For a command about to run functions with ``backend``: refuse a bundle it cannot run (``bundle``:
    its directory), and, for functions on this machine (``local``), create the backend's environment on
    first use, saying so on stderr."""
    if backend == "onnxruntime":
        return
    from serving.platform.runtimes import BackendEnvError, backend_env, ensure_backend_env

    if bundle is not None:
        from functions.backends.mxnet_onnx import bundle_problems

        problems = bundle_problems(bundle)  # type: ignore[arg-type]
        if problems:
            raise click.ClickException(
                f"the {backend} backend cannot run this bundle:\n  " + "\n  ".join(problems)
                + "\nRun it with --backend onnxruntime (the default)"
            )
    env = backend_env(backend)
    if env.ready or not local:
        return
    err_console.print(f"the {backend} backend runs in its own environment, which is not set up yet: creating it "
                      f"now (once; `flatpack backend setup {backend}` does the same)")
    try:
        ensure_backend_env(backend, progress=None if quiet else (lambda m: err_console.print(f"[dim]{m}[/]")))
    except BackendEnvError as e:
        raise click.ClickException(str(e)) from e

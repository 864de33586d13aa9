"""`flatpack bench ...`: each benchmark is a click command in the bench/ package, imported lazily."""

from __future__ import annotations

import importlib

import click

__all__ = ["bench"]

# benchmark name -> "module:attribute" (a click command)
_BENCHMARKS: dict[str, str] = {
    "transport": "bench.transport:transport_cmd",
    "autoencoder": "bench.autoencoder:autoencoder_cmd",
    "solvers": "bench.solvers:solvers_cmd",
    "endpoint": "bench.endpoint:endpoint_cmd",
    "perfmodel": "bench.perfmodel:perfmodel_cmd",
    "predictors": "bench.predictors:predictors_cmd",
    "load": "bench.load:load_cmd",
    "suite": "bench.suite:suite_cmd",
    "sim": "bench.sim:sim_cmd",
    "backends": "bench.backends:backends_cmd",
    "chaos": "bench.chaos:chaos_cmd",
    "soak": "bench.soak:soak_cmd",
}


class _LazyBench(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_BENCHMARKS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _BENCHMARKS.get(cmd_name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except ImportError as e:  # an optional extra that is not installed: say which, don't crash --help
            return _unavailable(cmd_name, e)


@click.group(cls=_LazyBench)
def bench() -> None:
    """Benchmarks: each prints its figure and the ratio to its baseline, measured in one run."""


def _unavailable(name: str, error: ImportError) -> click.Command:
    @click.command(name, help=f"(unavailable: {error})", context_settings={"ignore_unknown_options": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def cmd(args: tuple[str, ...]) -> None:
        raise click.ClickException(f"`{name}` needs a module that is not installed: {error}. "
                                   "Install the project's extras: pip install -e '.[dev]'")

    return cmd

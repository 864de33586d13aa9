"""`flatpack bench ...`: the benchmarks' command group, plugged into the `flatpack` CLI.

flatpack's command line knows nothing of this package: ``pyproject.toml`` registers this group
under the ``flatpack.commands`` entry-point group, which the CLI lists and loads on demand. Each benchmark
is a thin click command in its own module of :mod:`bench.commands`, imported only when it runs; the
benchmark itself is a library in one of bench's subpackages (see :mod:`bench`).
"""

from __future__ import annotations

from pathlib import Path

import click

from serving.lazy_commands import LazyGroup

__all__ = ["bench", "resolve_model"]

# benchmark name -> "module:attribute" (a click command)
_BENCHMARKS: dict[str, str] = {
    "transport": "bench.commands.transport:transport_cmd",
    "autoencoder": "bench.commands.autoencoder:autoencoder_cmd",
    "solvers": "bench.commands.solvers:solvers_cmd",
    "endpoint": "bench.commands.endpoint:endpoint_cmd",
    "perfmodel": "bench.commands.perfmodel:perfmodel_cmd",
    "predictors": "bench.commands.predictors:predictors_cmd",
    "load": "bench.commands.load:load_cmd",
    "suite": "bench.commands.suite:suite_cmd",
    "sim": "bench.commands.sim:sim_cmd",
    "backends": "bench.commands.backends:backends_cmd",
    "chaos": "bench.commands.chaos:chaos_cmd",
    "soak": "bench.commands.soak:soak_cmd",
    "cpushare": "bench.commands.cpushare:cpushare_cmd",
    "coldstart": "bench.commands.coldstart:coldstart_cmd",
    "lo": "bench.commands.lo:lo_cmd",
    "mopar": "bench.commands.mopar:mopar_cmd",
    "slo": "bench.commands.slo:slo_cmd",
    "intake": "bench.commands.intake:intake_cmd",
    "embedding": "bench.commands.embedding:embedding_cmd",
}


def _keep_report(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    """Hold ``--report DIR`` in the context, where :func:`bench.commands.output.report` finds it; at the end, say
    so if the command printed no document to write a page from."""
    from bench.commands.output import REPORT_KEY, reported

    if value is None:
        return
    ctx.meta[REPORT_KEY] = value

    def check() -> None:
        if not reported(ctx):
            click.echo(f"--report {value}: `{ctx.command_path}` printed no JSON document, so no page was written; "
                       "add --json", err=True)

    ctx.call_on_close(check)


def _report_option() -> click.Option:
    return click.Option(["--report"], type=click.Path(file_okay=False, path_type=Path), default=None,
                        metavar="DIR", expose_value=False, is_eager=True, callback=_keep_report,
                        help="Also write the result as a docs page, DIR/<benchmark>.md (a table of its rows, the "
                             "machine, date and git commit), e.g. --report docs/results/.")


class _BenchGroup(LazyGroup):
    """The benchmarks' group: every benchmark it loads also takes ``--report DIR``."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None and cmd_name in self.lazy and not any(p.name == "report" for p in command.params):
            command.params.append(_report_option())
        return command


@click.group(cls=_BenchGroup, lazy=_BENCHMARKS)
def bench() -> None:
    """Benchmarks: each prints its figure and the ratio to its baseline, measured in one run."""


def resolve_model(arg: str) -> Path:
    """A benchmark's MODEL argument: an ONNX file, or a zoo model built once into the cache."""
    from zoo.cache import model_file
    from zoo.errors import ZooError

    try:
        return model_file(arg)
    except (ZooError, ImportError) as e:
        raise click.ClickException(str(e)) from e

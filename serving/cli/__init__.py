"""The `flatpack` command line.

Each command lives in its own module and is imported only when it runs, so `flatpack --help` stays fast
and a command's heavy dependencies (torch for the zoo, say) are not needed by the others. Other packages
add commands through the ``flatpack.commands`` entry-point group (``bench`` does: `flatpack bench`), so
the CLI imports none of them.
"""

from __future__ import annotations

import logging

import click

from serving.lazy_commands import LazyGroup

__all__ = ["main"]

# command name -> "module:attribute"; the attribute is a click command or group.
_COMMANDS: dict[str, str] = {
    "zoo": "serving.cli.zoo:zoo",
    "inspect": "serving.cli.graph:inspect_cmd",
    "export": "serving.cli.graph:export_cmd",
    "verify": "serving.cli.graph:verify_cmd",
    "plan": "serving.cli.plan:plan_cmd",
    "deploy": "serving.cli.deploy:deploy_cmd",
    "serve": "serving.cli.deploy:serve_cmd",
    "ls": "serving.cli.deploy:ls_cmd",
    "status": "serving.cli.deploy:status_cmd",
    "invoke": "serving.cli.deploy:invoke_cmd",
    "trace": "serving.cli.trace:trace_cmd",
    "undeploy": "serving.cli.deploy:undeploy_cmd",
    "watch": "serving.cli.watch:watch_cmd",
    "run": "serving.cli.run:run_cmd",
    "platform": "serving.cli.platform:platform",
    "backend": "serving.cli.backend:backend",
    "compress": "serving.cli.compress:compress_cmd",
    "profile": "serving.cli.profile:profile_cmd",
    "calibrate": "serving.cli.calibrate:calibrate_cmd",
    "demo": "serving.cli.demo:demo_cmd",
}


PLUGIN_GROUP = "flatpack.commands"


class _Main(LazyGroup):
    def invoke(self, ctx: click.Context) -> object:
        # A file, directory or socket the environment refused (unwritable output, missing parent, port in
        # use) is the user's to fix: one line naming it, not a traceback.
        try:
            return super().invoke(ctx)
        except OSError as e:
            if isinstance(e, BrokenPipeError):
                raise
            what = f"{e.strerror}: {e.filename}" if e.strerror and e.filename else str(e)
            raise click.ClickException(f"{what}; check the path and its permissions") from e


@click.group(cls=_Main, lazy=_COMMANDS, plugins=PLUGIN_GROUP, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
@click.version_option(package_name="flatpack")
def main(verbose: int) -> None:
    """flatpack: serve deep-learning models on serverless functions, split into parallel parts."""
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    from functions.settings import log_level

    try:
        chosen = log_level(default=level)
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    logging.basicConfig(level=chosen, format="%(levelname)s %(name)s: %(message)s")

"""The `flatpack` command line.

Each command lives in its own module and is imported only when it runs, so `flatpack --help` stays fast
and a command's heavy dependencies (torch for the zoo, say) are not needed by the others.
"""

from __future__ import annotations

import importlib
import logging
import os

import click

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
    "undeploy": "serving.cli.deploy:undeploy_cmd",
    "run": "serving.cli.run:run_cmd",
    "platform": "serving.cli.platform:platform",
    "bench": "serving.cli.bench:bench",
    "backend": "serving.cli.backend:backend",
    "compress": "serving.cli.compress:compress_cmd",
    "profile": "serving.cli.profile:profile_cmd",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

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

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except ImportError as e:  # an optional extra that is not installed: say which, don't crash --help
            return _unavailable(cmd_name, e)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
@click.version_option(package_name="flatpack")
def main(verbose: int) -> None:
    """flatpack: serve deep-learning models on serverless functions, split into parallel parts."""
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    logging.basicConfig(level=os.environ.get("FLATPACK_LOG_LEVEL", level), format="%(levelname)s %(name)s: %(message)s")


def _unavailable(name: str, error: ImportError) -> click.Command:
    @click.command(name, help=f"(unavailable: {error})", context_settings={"ignore_unknown_options": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def cmd(args: tuple[str, ...]) -> None:
        raise click.ClickException(f"`{name}` needs a module that is not installed: {error}. "
                                   "Install the project's extras: pip install -e '.[dev]'")

    return cmd

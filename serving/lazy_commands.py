"""Click groups whose commands are imported when they run: the `flatpack` CLI and `flatpack bench` use it.

A command is named by ``"module:attribute"`` and imported on first use, so ``--help`` stays fast and a
command's heavy dependencies (torch for the zoo, say) are not needed by the others. A command whose module
cannot be imported (an optional extra that is not installed) is listed as unavailable, with the reason,
instead of breaking the whole group. Other packages may add commands through an entry-point group.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import click

__all__ = ["LazyGroup", "unavailable"]


class LazyGroup(click.Group):
    """``@click.group(cls=LazyGroup, lazy={"name": "module:attribute"}, plugins="entry.point.group")``:
    ``lazy`` commands are imported on first use; ``plugins`` names an entry-point group whose entries are
    commands too (a ``lazy`` command of the same name wins)."""

    def __init__(self, *args: Any, lazy: Mapping[str, str] | None = None, plugins: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})
        self.plugin_group = plugins

    def _plugins(self) -> dict[str, EntryPoint]:
        if self.plugin_group is None:
            return {}
        return {ep.name: ep for ep in entry_points(group=self.plugin_group) if ep.name not in self.lazy}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy, *self._plugins()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.lazy.get(cmd_name)
        try:
            if target is not None:
                module, _, attr = target.partition(":")
                command = getattr(importlib.import_module(module), attr)
            else:
                plugin = self._plugins().get(cmd_name)
                command = plugin.load() if plugin is not None else super().get_command(ctx, cmd_name)
        except ImportError as e:  # an optional extra that is not installed: say which, don't crash --help
            return unavailable(cmd_name, e)
        if command is not None and not isinstance(command, click.Command):
            raise TypeError(f"{target or cmd_name} is not a click command")
        return command


def unavailable(name: str, error: ImportError) -> click.Command:
    """A stand-in for command ``name`` whose module could not be imported: it says why and how to fix it."""

    @click.command(name, help=f"(unavailable: {error})", context_settings={"ignore_unknown_options": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def cmd(args: tuple[str, ...]) -> None:
        raise click.ClickException(f"`{name}` needs a module that is not installed: {error}. "
                                   "Install the project's extras: pip install -e '.[dev]'")

    return cmd

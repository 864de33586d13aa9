"""``--input-shape`` and ``--dim``: the options that fix a model's dynamic input dimensions.

Every command that loads a model (inspect, export, verify, profile, plan, deploy) takes them through
:func:`shape_options`, which parses both into one ``shapes`` argument of the command, so they mean the
same everywhere and a malformed one is refused before any work starts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

if TYPE_CHECKING:  # the partitioner is imported when a command runs, not when the CLI starts
    from partitioner.normalize import ShapeFixes

__all__ = ["shape_options"]

_Command = TypeVar("_Command", bound=Callable[..., Any])

_OPTIONS = (
    click.option("--dim", "dims", multiple=True, metavar="NAME=SIZE",
                 help="Fix a symbolic input dimension by name in every input that has it, e.g. --dim batch=1 "
                      "--dim seq=128 (repeatable). A leading batch axis defaults to 1."),
    click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=1x3x224x224",
                 help="Fix the whole shape of input NAME (repeatable); takes precedence over --dim for it."),
)


def shape_options(f: _Command) -> _Command:
    """Add ``--input-shape`` and ``--dim`` to a click command; it receives them as ``shapes: ShapeFixes``."""

    @functools.wraps(f)
    def command(*args: Any, input_shapes: tuple[str, ...], dims: tuple[str, ...], **kwargs: Any) -> Any:
        return f(*args, shapes=_parse(input_shapes, dims), **kwargs)

    for option in reversed(_OPTIONS):
        command = option(command)
    return cast(_Command, command)


def _parse(input_shapes: tuple[str, ...], dims: tuple[str, ...]) -> ShapeFixes:
    """Both options parsed; a malformed value is a usage error naming it."""
    from partitioner.errors import ModelError
    from partitioner.normalize import ShapeFixes

    try:
        return ShapeFixes.parse(input_shapes, dims)
    except ModelError as e:
        raise click.UsageError(str(e)) from e

"""The optional DEPLOYMENT argument of the reliability commands (``chaos``, ``soak``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

__all__ = ["own_deployment", "run_and_tear_down"]

T = TypeVar("T")


def own_deployment(deployment: str | None, say: Any, **small: Any) -> Any:
    """DEPLOYMENT's :class:`ExistingDeployment`, or (None) a small deployment of the benchmark's own; click
    errors that name the fix when neither can be had."""
    from bench.harness.local_deployment import ExistingDeployment, SmallDeployment

    try:
        if deployment:
            return ExistingDeployment(deployment)
        return SmallDeployment(progress=say, **small)
    except (LookupError, ValueError, FileNotFoundError) as e:
        raise click.ClickException(str(e)) from e
    except ImportError as e:  # the small model is built with torch (the zoo extra)
        raise click.ClickException(f"deploying the small model needs {e.name or e}: pip install -e '.[zoo]', "
                                   "or name a running deployment") from e


def run_and_tear_down(dep: Any, run: Callable[[Any], T], *, own: bool, say: Callable[[str], None]
                      ) -> tuple[T, dict[str, int]]:
    """``run(dep)`` (a ValueError becomes a click error), then ``dep`` closed whatever happened; the result
    and what its teardown found left behind (``own``: the deployment the command started, said so)."""
    try:
        result = run(dep)
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    finally:
        if own:
            say("tearing down")
        left = dep.close()
    return result, left

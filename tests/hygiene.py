"""A test run keeps off the user's machine, and ``--leak-check`` proves it.

:func:`isolate` (called when ``tests/conftest.py`` is imported) points flatpack's cache
(``FLATPACK_CACHE_DIR``, and matplotlib's ``MPLCONFIGDIR`` and ``XDG_CACHE_HOME`` in it), its state
(``FLATPACK_STATE_DIR``) and the temporary directory (``TMPDIR``, which ``tempfile``, stable-baselines3, torch
and every subprocess follow) into one tree of this run's own,
``<tmp>/flatpack-tests-*`` (with a ``home`` for the subprocesses of tools that write to ``$HOME``, such as
the Serverless Framework). The process that makes the tree (pytest's controller under xdist) owns it and
removes it when the run ends; xdist's workers inherit its environment, so they share one zoo cache and
build each model once.

With ``--leak-check`` (``make test`` passes it) the controller lists, before and after the run, what lies
in the places a leak lands: the top of ``$HOME``, ``~/.cache``, ``~/.config``, ``~/.local/state`` and of the
real temporary directory, and everything under ``~/.cache/flatpack``, ``~/.local/state/flatpack`` and
``<tmp>/flatpack``. Anything new fails the run (exit status 1) and is named. Other runs' own trees
(``flatpack-tests-*``) are left out, so runs side by side do not fail each other.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

__all__ = ["isolate", "leaked", "snapshot"]

ROOT_ENV = "FLATPACK_TEST_ROOT"
_OWNER_ENV = "FLATPACK_TEST_ROOT_OWNER"
_REAL_TMP_ENV = "FLATPACK_TEST_REAL_TMPDIR"
_PREFIX = "flatpack-tests-"


def isolate() -> Path:
    """This run's tree (made on the first call, in the process that will remove it), with the cache, state
    and temporary directories pointed into it. Idempotent; a process that inherits the tree keeps it."""
    root = os.environ.get(ROOT_ENV)
    if root is None or not Path(root).is_dir():
        os.environ[_REAL_TMP_ENV] = tempfile.gettempdir()
        root = tempfile.mkdtemp(prefix=_PREFIX)
        os.environ[ROOT_ENV] = root
        os.environ[_OWNER_ENV] = str(os.getpid())
        for sub, var in (("cache", "FLATPACK_CACHE_DIR"), ("state", "FLATPACK_STATE_DIR"), ("tmp", "TMPDIR")):
            path = Path(root) / sub
            path.mkdir()
            os.environ[var] = str(path)
        (Path(root) / "home").mkdir()  # HOME for tools that write there (the Serverless Framework, npm)
        # matplotlib (plots, trace PNGs) keeps its font cache in ~/.cache/matplotlib or ~/.config/matplotlib
        # unless told otherwise; a fresh machine's first plot would leave them
        mpl = Path(root) / "cache" / "matplotlib"
        mpl.mkdir()
        os.environ["MPLCONFIGDIR"] = str(mpl)
        # onnxruntime writes a device id under $XDG_CACHE_HOME (~/.cache/Microsoft) the first time a process
        # on the machine makes a session: on a fresh machine that is this run
        xdg = Path(root) / "cache" / "xdg"
        xdg.mkdir()
        os.environ["XDG_CACHE_HOME"] = str(xdg)
    tempfile.tempdir = None  # gettempdir() caches its answer: read TMPDIR again
    return Path(root)


def remove_if_owner() -> None:
    """Remove this run's tree, from the process that made it only."""
    root = os.environ.get(ROOT_ENV)
    if root and os.environ.get(_OWNER_ENV) == str(os.getpid()):
        shutil.rmtree(root, ignore_errors=True)


def _watched() -> tuple[list[Path], list[Path]]:
    """(directories whose top level is listed, directories listed to the bottom)."""
    home = Path.home()
    tmp = Path(os.environ.get(_REAL_TMP_ENV) or tempfile.gettempdir())
    top = [home, home / ".cache", home / ".config", home / ".local" / "state", tmp]
    deep = [home / ".cache" / "flatpack", home / ".local" / "state" / "flatpack", tmp / "flatpack"]
    return top, deep


def snapshot() -> set[Path]:
    """Every path in the watched places, now."""
    top, deep = _watched()
    seen: set[Path] = set()
    for d in top:
        if d.is_dir():
            seen.update(p for p in d.iterdir() if not p.name.startswith(_PREFIX))
    for d in deep:
        if d.is_dir():
            seen.update(d.rglob("*"))
    return seen


def leaked(before: set[Path]) -> list[Path]:
    """What is in the watched places now and was not in ``before``."""
    return sorted(snapshot() - before)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--leak-check", action="store_true", default=False,
                     help="fail the run when it leaves files in $HOME or the temporary directory "
                          "(~/.cache/flatpack, /tmp/SB3-*, $TMPDIR/flatpack, ...)")


def _is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")  # xdist's workers have it


_BEFORE = pytest.StashKey[set[Path]]()


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--leak-check") and _is_controller(config):
        config.stash[_BEFORE] = snapshot()


@pytest.hookimpl(trylast=True)  # after the runner's own hook has torn the session's fixtures down
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.config.stash.get(_BEFORE, None)
    if before is None:
        return
    new = leaked(before)
    if not new:
        return
    shown = "\n".join(f"  {p}" for p in new[:50]) + (f"\n  ... and {len(new) - 50} more" if len(new) > 50 else "")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = (f"--leak-check: the run left {len(new)} new path(s) in $HOME or the temporary directory; "
               f"point what wrote them at $FLATPACK_CACHE_DIR, $FLATPACK_STATE_DIR or $TMPDIR:\n{shown}")
    if reporter is not None:
        reporter.write_line(message, red=True)
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    remove_if_owner()

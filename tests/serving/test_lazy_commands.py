"""Lazily imported CLI commands: listed without importing them, loaded on use, a missing extra named."""

from __future__ import annotations

import sys

import click
from click.testing import CliRunner

from serving.lazy_commands import LazyGroup


@click.group(cls=LazyGroup, lazy={"verify": "serving.cli.graph:verify_cmd", "broken": "no_such_module:cmd"})
def cli() -> None:
    """A test group."""


def test_no_command_is_imported_until_the_group_needs_it() -> None:
    sys.modules.pop("serving.cli.graph", None)
    ctx = click.Context(cli)
    assert sorted(cli.list_commands(ctx)) == ["broken", "verify"]
    assert "serving.cli.graph" not in sys.modules
    result = CliRunner().invoke(cli, ["--help"])  # help shows each command's first line: now it is imported
    assert result.exit_code == 0 and "verify" in result.output and "(unavailable: " in result.output


def test_a_command_runs_when_its_module_imports() -> None:
    result = CliRunner().invoke(cli, ["verify", "--help"])
    assert result.exit_code == 0 and "--all-options" in result.output


def test_a_command_whose_module_is_missing_says_so_instead_of_breaking_the_group() -> None:
    result = CliRunner().invoke(cli, ["broken", "x"])
    assert result.exit_code == 1
    assert "`broken` needs a module that is not installed" in result.output and "no_such_module" in result.output


def test_flatpack_lists_bench_through_its_entry_point() -> None:
    from serving.cli import main

    result = CliRunner().invoke(main, ["bench", "--help"])
    assert result.exit_code == 0 and "sim" in result.output and "chaos" in result.output

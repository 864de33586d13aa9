"""A benchmark's JSON becomes a docs results page: its rows as a table, the machine, date and commit; and
``flatpack bench NAME --json --report DIR`` writes DIR/NAME.md through that one function."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from bench.cli import _BenchGroup
from bench.commands.output import echo_json
from bench.harness.results_page import results_page, write_results_page

_DOC = {
    "cpu_limit": "dilation",
    "machine": {"cpu": "Test CPU 9000", "cores": 2, "git": "abc1234"},
    "rounds": 20,
    "rows": [{"model": "vgg11/w2", "memory_mb": 512, "speedup": 1.8312, "oversubscribed": False},
             {"model": "vgg16/w2", "memory_mb": 1769, "speedup": None, "note": "a|b"}],
    "checks": {"exact_cheapest": True},
    "samples_ms": [1.0] * 50,
}


def test_a_page_has_the_provenance_and_a_table_of_the_rows() -> None:
    page = results_page("lo", _DOC, now=datetime(2026, 1, 2, 3, 4, tzinfo=UTC))
    lines = page.splitlines()
    assert lines[0] == "# bench lo"
    assert "| Test CPU 9000, 2 cores" in page and "2026-01-02 03:04 UTC" in page and "`abc1234`" in page
    assert "| dilation |" in page
    table = lines[lines.index("## rows") + 2:]
    assert table[0] == "| model | memory_mb | speedup | oversubscribed | note |"
    assert table[2] == "| vgg11/w2 | 512 | 1.831 | no | - |"
    assert table[3] == "| vgg16/w2 | 1769 | - | - | a\\|b |"  # a pipe in a value does not break the table
    assert "| rounds | 20 |" in page and "| checks.exact_cheapest | yes |" in page
    assert "| samples_ms | 50 values |" in page  # raw samples are counted, not listed


def test_a_page_written_later_is_dated_when_the_figures_were_taken() -> None:
    """A page written from saved JSON (``write_results_page`` after the run) carries the run's date from its
    machine record, not the day it was written; a record without one (or an unreadable one) gets now."""
    taken = {**_DOC, "machine": {**_DOC["machine"], "date": "2026-11-29T00:55:12+00:00"}}
    assert "| 2026-11-29 00:55 UTC |" in results_page("mopar", taken)
    garbled = {**_DOC, "machine": {**_DOC["machine"], "date": "yesterday"}}
    before = datetime.now(UTC).strftime("%Y-%m-%d")
    page = results_page("mopar", garbled)
    assert before in page or datetime.now(UTC).strftime("%Y-%m-%d") in page  # a run across midnight: either day
    from bench.harness.provenance import machine

    assert datetime.fromisoformat(machine()["date"]).tzinfo is not None


def test_write_names_the_page_after_the_benchmark_and_refreshes_the_index(tmp_path: Path) -> None:
    (tmp_path / "index.md").write_text("# Results\n\n<!-- pages -->\nold\n<!-- /pages -->\n\nafter\n")
    path = write_results_page(tmp_path, "transport", {"rows": [{"size": 1}]})
    assert path == tmp_path / "transport.md" and path.read_text().startswith("# bench transport\n")
    write_results_page(tmp_path, "lo", {"rows": []})
    index = (tmp_path / "index.md").read_text()
    assert "- [bench lo](lo.md)\n- [bench transport](transport.md)\n" in index
    assert "old" not in index and index.endswith("<!-- /pages -->\n\nafter\n")
    with pytest.raises(ValueError, match="cannot name a page"):
        write_results_page(tmp_path, "../escape", {})


@click.command("fake")
@click.option("--json", "as_json", is_flag=True)
def _fake_cmd(as_json: bool) -> None:
    if as_json:
        echo_json(_DOC)


def test_report_option_writes_the_page_of_the_printed_json(tmp_path: Path) -> None:
    group = _BenchGroup("bench", lazy={"fake": f"{__name__}:_fake_cmd"})
    runner = CliRunner()
    result = runner.invoke(group, ["fake", "--json", "--report", str(tmp_path / "results")])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "results" / "fake.md").read_text()
    assert "## rows" in page and "vgg16/w2" in page

    result = runner.invoke(group, ["fake", "--report", str(tmp_path / "none")])
    assert result.exit_code == 0 and not (tmp_path / "none").exists()
    assert "no page was written" in result.output

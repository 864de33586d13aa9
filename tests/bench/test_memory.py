"""The benchmarks' memory backing: once per boot, marked, and bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness import memory


def test_free_memory_is_touched_once_per_boot(tmp_path: Path) -> None:
    said: list[str] = []
    assert memory.back_free_memory(said.append, marker_dir=tmp_path, limit_mb=256) == 256
    marks = list(tmp_path.iterdir())
    assert len(marks) == 1 and marks[0].name == f"memory-backed-{memory._boot_id()}"
    assert "256 MB" in marks[0].read_text() and said[0].startswith("touching ")
    assert memory.back_free_memory(said.append, marker_dir=tmp_path, limit_mb=256) == 0
    assert len(said) == 1


def test_nothing_is_touched_where_the_machine_does_not_say_its_boot_or_memory(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "_boot_id", lambda: "")
    assert memory.back_free_memory(marker_dir=tmp_path, limit_mb=256) == 0
    monkeypatch.setattr(memory, "_boot_id", lambda: "b")
    monkeypatch.setattr(memory, "_available_mb", lambda: memory.RESERVE_MB + 100)
    assert memory.back_free_memory(marker_dir=tmp_path, limit_mb=256) == 0
    assert not list(tmp_path.iterdir())

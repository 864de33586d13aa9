"""Progress of long work where stderr is not a terminal: a line per step, not a spinner that shows nothing."""

from __future__ import annotations

import pytest

from serving.console import status


def test_progress_to_a_file_or_pipe_is_a_line_per_step_with_its_text_as_given(
        capsys: pytest.CaptureFixture[str]) -> None:
    with status("bench lo") as say:
        say("vgg11/w2@224 at 512 MB: planning")
        say("round 1: [m+w@512] stages")  # brackets are text, not markup
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 3
    assert lines[0].endswith("] bench lo")  # the work's start: a long first step shows it is under way
    assert lines[1].endswith("bench lo: vgg11/w2@224 at 512 MB: planning")
    assert lines[2].endswith("bench lo: round 1: [m+w@512] stages")
    assert all(line.startswith("[") and " s] " in line for line in lines)  # seconds since the start


def test_a_run_of_like_steps_is_thinned_to_a_line_a_while(capsys: pytest.CaptureFixture[str]) -> None:
    with status("planning", every_s=3600) as say:
        for i in range(1, 301):
            say(f"profiling units: {i}/300 measurements")
        say("solving")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert [ln.split("] ", 1)[1] for ln in lines] == [
        "planning", "planning: profiling units: 1/300 measurements", "planning: solving"]


def test_different_steps_of_one_item_each_get_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Only steps that differ in their numbers alone are like: a model's steps in quick succession all show."""
    with status("bench mopar", every_s=3600) as say:
        say("vgg16/w2@224: profiling its units (cached) and planning")
        say("vgg16/w2@224: timing the whole model")
        say("vgg16/w2@224: 20 interleaved rounds")
        say("vgg16/w2@224: 21 interleaved rounds")
    lines = [ln.split("] ", 1)[1] for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert lines == ["bench mopar", "bench mopar: vgg16/w2@224: profiling its units (cached) and planning",
                     "bench mopar: vgg16/w2@224: timing the whole model",
                     "bench mopar: vgg16/w2@224: 20 interleaved rounds"]

"""`flatpack demo`'s SLO: one the unsplit function misses and the fastest plan meets, on any machine."""

from __future__ import annotations

import pytest

from serving.cli.demo import demo_slo_ms


@pytest.mark.parametrize(("unsplit", "fastest"), [(118.0, 71.0), (280.0, 140.0), (60.0, 50.0), (1000.0, 200.0)])
def test_slo_lies_between_the_unsplit_function_and_the_fastest_plan(unsplit: float, fastest: float) -> None:
    slo = demo_slo_ms(unsplit, fastest)
    assert slo is not None
    assert fastest < slo < unsplit
    assert slo == int(slo)


@pytest.mark.parametrize(("unsplit", "fastest"), [(100.0, 95.0), (100.0, 120.0), (0.0, 10.0)])
def test_no_slo_where_splitting_gains_little(unsplit: float, fastest: float) -> None:
    assert demo_slo_ms(unsplit, fastest) is None

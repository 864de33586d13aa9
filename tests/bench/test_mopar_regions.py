"""``bench mopar``'s in-process regions: a model of embedding tables run cut at its lookups beside the reference,
so that the reference's scale lands on the region whose time it is."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest

from bench.load.targets import InProcessChainTarget, InProcessTarget
from bench.suite.mopar_live import lookup_regions, region_scales, region_target
from partitioner.graph import LayerGraph
from partitioner.perf.compute import ComputeModel
from partitioner.verify import rel_err


@pytest.fixture(scope="module")
def tiny_dlrm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from zoo import build

    path = tmp_path_factory.mktemp("dlrm") / "dlrm.onnx"
    onnx.save(build("dlrm", vocab=3000, hidden=16, layers=3, seq_len=4, width_div=8, input_size=8), path)
    return path


def test_a_dlrms_regions_are_the_lookups_and_the_runs_around_them(tiny_dlrm: Path) -> None:
    lg = LayerGraph.load(tiny_dlrm)
    regions = lookup_regions(lg)
    lookups = [r for r in regions if all("Gather" in {lg.nodes[n].op_type for n in lg.units[u].nodes}
                                         for u in range(r[0], r[1] + 1))]
    # every unit in exactly one region, in order; the lookups a region of their own between the MLPs
    assert [u for a, b in regions for u in range(a, b + 1)] == list(range(len(lg.units)))
    assert len(regions) == 3 and lookups == [regions[1]]


def test_a_model_without_lookups_has_no_regions(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from zoo import build

    path = tmp_path / "resnet18.onnx"
    onnx.save(build("resnet18", width_div=16, input_size=32), path)
    assert lookup_regions(LayerGraph.load(path)) == []


def test_the_chain_of_regions_answers_as_the_whole_model_and_times_each_part(tiny_dlrm: Path,
                                                                                 tmp_path: Path) -> None:
    lg = LayerGraph.load(tiny_dlrm)
    regions = lookup_regions(lg)
    chain = region_target(lg, regions, tmp_path / "regions")
    whole = InProcessTarget(tiny_dlrm)
    feeds = _inputs(tiny_dlrm)
    for x in feeds:
        got, want = chain.infer(x), whole.infer(x)
        assert set(got) == set(want)
        assert all(rel_err(got[k], v) <= 1e-5 for k, v in want.items())
    assert len(chain.timings) == len(feeds)
    for t in chain.timings:
        parts = [t[f"part{k}_ms"] for k in range(len(regions))]
        assert all(p > 0 for p in parts) and t["stage0_ms"] == pytest.approx(sum(parts))
        assert t["noop_ms"] > 0  # a session run's own time, beside the parts


def test_a_chain_whose_part_reads_what_nothing_gives_says_which(tiny_dlrm: Path, tmp_path: Path) -> None:
    lg = LayerGraph.load(tiny_dlrm)
    regions = lookup_regions(lg)
    chain = region_target(lg, regions, tmp_path / "regions")
    x = _inputs(tiny_dlrm)[0]
    dropped = sorted(x)[0]
    with pytest.raises(ValueError, match=dropped):
        chain.infer({k: v for k, v in x.items() if k != dropped})
    with pytest.raises(ValueError, match="at least one part"):
        InProcessChainTarget([])


def test_region_scales_give_each_region_its_share_as_the_rounds_ran_it() -> None:
    cm = ComputeModel(unit_ms=({1: 1.0}, {1: 1.0}, {1: 2.0}), unit_flops=(1, 1, 1), overhead_ms=0.0)
    # the profile has the regions at 2 : 2 ms; the rounds ran them at 1 : 7 ms (the lookups read cold)
    chain = SimpleNamespace(timings=[{"part0_ms": 1.0, "part1_ms": 7.0, "stage0_ms": 8.0}] * 5)
    got = region_scales(cm, chain, [(0, 1), (2, 2)], rounds=5)
    assert got is not None
    scaled, note = got
    units = [u[1] for u in scaled.unit_ms]
    assert sum(units) == pytest.approx(4.0)  # the units' total kept: the whole's time is the reference's to set
    assert (units[0] + units[1]) / units[2] == pytest.approx(1.0 / 7.0)
    assert units[0] == pytest.approx(units[1])  # within a region, the profile's shares
    assert "units 2-2 x3.50" in note
    # a session run's own time, timed in the same rounds, is not the region's
    ran = SimpleNamespace(timings=[{"part0_ms": 1.5, "part1_ms": 7.5, "stage0_ms": 9.0, "noop_ms": 0.5}] * 5)
    again = region_scales(cm, ran, [(0, 1), (2, 2)], rounds=5)
    assert again is not None and [u[1] for u in again[0].unit_ms] == pytest.approx(units)
    # nothing timed: nothing to say
    assert region_scales(cm, SimpleNamespace(timings=[]), [(0, 1), (2, 2)], rounds=5) is None


def _inputs(model: Path) -> list[dict[str, np.ndarray]]:
    from partitioner.inputs import random_inputs

    return [dict(random_inputs(onnx.load(model), seed=s)) for s in range(3)]

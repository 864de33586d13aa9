"""bench.suite.intake: a row records what a user would see of one model, served the way it is asked for."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest

from bench.suite.intake import _InProcess, _row, corpus, run_intake


def _helper(name: str):  # noqa: ANN202 - a corpus entry
    return next(e for e in corpus((), helpers=True) if e.model == name)


def test_a_helper_row_in_process_loads_splits_and_serves_exactly() -> None:
    (row,) = run_intake(iter([_helper("helper-anonymous-dims")]), serve="in-process").rows
    assert row.loads and row.serves_exact and row.verify_failed == 0, row
    assert row.served_through == "in-process"
    assert row.served_split != "none" and "spatial" in row.split_families
    assert row.max_rel_err is not None and row.max_rel_err <= 1e-4


class _WrongAnswers(_InProcess):
    """Serves the bundle, then answers with every output shifted by one."""

    def answers(self, bundle: Path, requests: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        return [{k: v + 1 for k, v in a.items()} for a in super().answers(bundle, requests)]


def test_a_served_answer_that_differs_is_not_exact() -> None:
    row = _row(_helper("helper-anonymous-dims"), False, _WrongAnswers())
    assert row.loads and not row.serves_exact and row.error is None
    assert row.max_rel_err is not None and row.max_rel_err > 1e-4


def test_an_unknown_serve_mode_is_refused_naming_the_modes() -> None:
    with pytest.raises(ValueError, match=r"unknown serve mode 'lambda'; use one of endpoint, in-process"):
        run_intake(iter([]), serve="lambda")


def test_the_corpus_has_each_zoo_model_from_both_torch_exporters() -> None:
    pytest.importorskip("torch")
    entries = list(corpus(["vgg11"], ["fp32"], helpers=False))
    assert [e.model for e in entries] == ["vgg11", "vgg11-dynamo"]
    meta = [json.loads(next(m.value for m in e.proto.metadata_props if m.key == "flatpack.zoo")) for e in entries]
    assert [m["options"]["exporter"] for m in meta] == ["legacy", "dynamo"]

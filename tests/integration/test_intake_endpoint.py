"""``flatpack bench intake`` serves each row's bundle the way a user's requests reach it: deployed on a real
local platform (its own process, a function per part) and asked over HTTP through the endpoint."""

from __future__ import annotations

from bench.suite.intake import corpus, run_intake


def test_a_split_bundle_served_through_the_endpoint_answers_as_onnxruntime_does() -> None:
    entry = next(e for e in corpus((), helpers=True) if e.model == "helper-com-microsoft")
    (row,) = run_intake(iter([entry]), verify=False).rows
    assert row.error is None, row.error
    assert row.served_through == "endpoint"
    assert row.served_split != "none"  # a master and two workers served it
    assert row.serves_exact and row.max_rel_err is not None and row.max_rel_err <= 1e-4

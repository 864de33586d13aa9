"""The benchmarks' typed results turn into the JSON their commands always printed: a suite row keeps exactly
the keys of its kind, and the chaos and soak counts add up."""

from __future__ import annotations

from bench.load.latency import Sample
from bench.reliability.faults import FaultCounts, Outcomes
from bench.suite.comparison import Comparison, latency_comparison


def _sample(i: int, ms: float, error: str | None = None, correct: bool = True) -> Sample:
    return Sample(i, 0, i * 0.01, i * 0.01, ms, ms, error, correct, 0.0)


def test_a_latency_comparison_has_the_keys_the_suite_printed() -> None:
    samples = {"default": [_sample(i, 20.0) for i in range(4)], "lo": [_sample(i, 10.0) for i in range(4)]}
    c = latency_comparison("lo_vs_default", "vgg16/w2@224", "default", "lo", samples, keep_samples=True,
                           notes=["every function 1769 MB"], plan=["0-:none"])
    doc = c.to_json()
    assert set(doc) == {"name", "model", "baseline", "candidate", "metric", "baseline_value", "candidate_value",
                        "ratio", "paired_ratio", "requests", "errors", "correct", "first_error", "source",
                        "baseline_p99_ms", "candidate_p99_ms", "notes", "plan", "samples_ms"}
    assert doc["ratio"] == doc["paired_ratio"] == 2.0 and doc["correct"] and doc["first_error"] is None
    assert doc["samples_ms"] == {"default": [20.0] * 4, "lo": [10.0] * 4}
    assert "samples_ms" not in c.to_json(with_samples=False)


def test_a_wrong_answer_makes_a_comparison_incorrect() -> None:
    samples = {"redis": [_sample(0, 5.0)], "shm": [_sample(0, 4.0, correct=False)]}
    doc = latency_comparison("shm_vs_redis", "vgg16", "redis", "shm", samples).to_json()
    assert doc["errors"] == 1 and doc["correct"] is False and doc["first_error"].startswith("wrong output")
    assert "notes" not in doc and "samples_ms" not in doc  # neither asked for


def test_a_comparison_that_did_not_run_has_only_what_it_knows() -> None:
    failed = Comparison("mopar", "vgg16", None, 1, "failed", notes=("RuntimeError: boom",)).to_json()
    assert failed == {"name": "mopar", "model": "vgg16", "ratio": None, "errors": 1, "correct": False,
                      "source": "failed", "notes": ["RuntimeError: boom"]}
    skipped = Comparison("shm_vs_redis", "vgg16", None, 0, "measured", "redis", "shm", "p50 latency ms",
                         notes=("no Redis server",)).to_json()
    assert set(skipped) == {"name", "model", "baseline", "candidate", "metric", "ratio", "errors", "correct",
                            "source", "notes"}


def test_outcomes_and_fault_counts() -> None:
    samples = [_sample(0, 1.0), _sample(1, 1.0, correct=False),
               _sample(2, 1.0, error='InferError: HTTP 502: {"error": "worker crashed"}'),
               _sample(3, 1.0, error="ConnectionError: reset")]
    assert Outcomes.of(samples).to_json() == {"sent": 4, "answered": 2, "correct": 1, "wrong": 1, "clear_errors": 1,
                                              "lost": 1}
    total = FaultCounts(10, 1, 0) + FaultCounts(30, 3, 1)
    assert total.to_json() == {"worker_invocations": 40, "kills": 4, "stragglers": 1, "kill_fraction": 0.1,
                               "straggler_fraction": 0.025}
    assert FaultCounts().kill_fraction == 0.0


def test_the_solvers_checks_and_hits() -> None:
    from bench.components.solvers import SolverRow, SolversResult

    def rows(slo: float, **costs: tuple[float | None, bool]) -> list[SolverRow]:
        return [SolverRow("vgg11", slo, s, c, 1.0 if c else None, met, 0.1) for s, (c, met) in costs.items()]

    good = rows(200.0, exact=(1.0, True), bruteforce=(1.0, True), rl=(1.0, True), bo=(1.5, True), mopar=(0.5, False)) \
        + rows(100.0, exact=(None, False), bruteforce=(None, False), rl=(None, False), bo=(None, False),
               mopar=(0.5, False))
    result = SolversResult(tuple(good), {}, {})
    assert result.checks() == {"exact_equals_bruteforce": True, "exact_cheapest": True, "rl_feasible": True,
                               "bo_feasible": True}
    assert result.hits_exact() == {"rl": [1, 1], "bo": [0, 1], "mopar": [0, 1]}
    assert result.to_json()["checks"] == result.checks()
    bad = rows(200.0, exact=(1.0, True), bruteforce=(0.9, True), rl=(None, False), bo=(0.8, True), mopar=(2.0, True))
    assert SolversResult(tuple(bad), {}, {}).checks() == {"exact_equals_bruteforce": False, "exact_cheapest": False,
                                                          "rl_feasible": False, "bo_feasible": True}
    only = SolversResult(tuple(r for r in good if r.solver in ("exact", "rl")), {}, {})
    assert only.checks() == {"exact_cheapest": True, "rl_feasible": True}

"""What every benchmark shares: provenance of a figure, the deployment a reliability benchmark starts by
itself, a Redis of its own, the no-op function, reports and plots, signal handling.

- :mod:`~bench.harness.provenance`: the machine, versions and git revision a figure was measured on;
- :mod:`~bench.harness.local_deployment`: a small deployment started, disturbed and torn down by a benchmark;
- :mod:`~bench.harness.redis_server`: a Redis that answers, or one of the benchmark's own;
- :mod:`~bench.harness.noop`: a function that does nothing, to time an invoke path;
- :mod:`~bench.harness.report`: markdown reports and matplotlib plots;
- :mod:`~bench.harness.results_page`: a benchmark's JSON as a page of the docs (``--report DIR``);
- :mod:`~bench.harness.signals`: SIGTERM ends a long run cleanly.

Modules are imported by name; this package imports none of them.
"""

__all__: list[str] = []

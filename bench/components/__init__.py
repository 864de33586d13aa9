"""Benchmarks of one component each, every one a ratio to its baseline measured in one run.

- :mod:`~bench.components.transport`: put+get throughput of each transport vs memcpy;
- :mod:`~bench.components.endpoint`: the HTTP endpoint's latency vs onnxruntime in-process;
- :mod:`~bench.components.perfmodel`: the performance model's predictions vs live runs;
- :mod:`~bench.components.predictors` (with :mod:`~bench.components.regression`, MOPAR's linear baseline
  and the scores): the profiler's predictors vs linear regression on unseen models;
- :mod:`~bench.components.solvers`: the SLO solvers on one search space;
- :mod:`~bench.components.autoencoder`: MOPAR's split-point autoencoders, accuracy vs bytes;
- :mod:`~bench.components.backends` (with :mod:`~bench.components.backends_mxnet`, the MXNet side, run in
  the MXNet environment: so this package imports none of its modules): onnxruntime vs MXNet per part.
"""

__all__: list[str] = []

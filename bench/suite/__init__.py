"""The papers' comparisons (``flatpack bench suite``): each a ratio of a candidate to a baseline, measured
in one run on the local platform.

- :mod:`~bench.suite.runner`: the suite and its typed result; :mod:`~bench.suite.config`: what it runs;
- :mod:`~bench.suite.gillis`, :mod:`~bench.suite.mopar`, :mod:`~bench.suite.transports`: the comparisons;
- :mod:`~bench.suite.comparison`: a row of the suite, from interleaved samples;
- :mod:`~bench.suite.deployments`: what a comparison deploys, and the interleaved rounds over it;
- :mod:`~bench.suite.planning`: the invoke path measured now, and the plans made with it;
- :mod:`~bench.suite.baselines`: Unsplit, Uniform and Pipeline's groups; :mod:`~bench.suite.pipeline_function`:
  Gillis's Pipeline as a function (a process of its own, so this package imports none of its modules).
"""

__all__: list[str] = []

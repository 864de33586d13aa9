"""flatpack's benchmarks: libraries, one subpackage per concern, and thin ``flatpack bench`` commands.

- :mod:`bench.sim`: the discrete-event serverless simulator, its calibration and its live validation;
- :mod:`bench.load`: load generators, latency statistics, arrival traces, the meter's bill, other load;
- :mod:`bench.suite`: the papers' comparisons, their baselines, Gillis's Pipeline function;
- :mod:`bench.components`: one component each (transports, endpoint, perf model, predictors, solvers,
  autoencoders, backends);
- :mod:`bench.reliability`: faults under load (chaos) and long steady loads (soak);
- :mod:`bench.harness`: what they share (provenance, the self-starting local deployment, a Redis of its
  own, reports and plots);
- :mod:`bench.commands`: one click module per command, registered in :mod:`bench.cli`.

Libraries return typed results (frozen dataclasses with ``to_json()``) and never print; commands parse
options, call a library and print its result as JSON or a rich table. Nothing outside ``bench`` (and the
tests) imports it, and it imports nothing of the CLI (the consoles come from ``serving.console``).
"""

__all__: list[str] = []

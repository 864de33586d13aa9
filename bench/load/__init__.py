"""Load generation and its statistics: what a benchmark sends to a deployment, and what came back.

- :mod:`~bench.load.inputs`: the input pool and each input's expected output;
- :mod:`~bench.load.targets`: what a load is sent to (an endpoint, a deployment's master);
- :mod:`~bench.load.generators`: closed loops, open loops, interleaved comparisons;
- :mod:`~bench.load.run`: a whole run (warm-up, load, meter) and its typed result;
- :mod:`~bench.load.latency`: samples and latency statistics; :mod:`~bench.load.usage`: the meter's bill;
- :mod:`~bench.load.trace`: arrival times (Poisson, MOPAR's diurnal trace);
- :mod:`~bench.load.background`: the machine's other load while a run goes.

Modules are imported by name (``from bench.load.run import run_load``); this package imports none of them.
"""

__all__: list[str] = []

"""The serverless platform simulated, for loads one machine cannot host, and checked against live runs.

- :mod:`~bench.sim.simulator`: the discrete-event simulator (instances, invoke latency, shared cores, billing);
- :mod:`~bench.sim.plans`: flatpack plans and platform profiles as the simulator's inputs;
- :mod:`~bench.sim.whatif`: a plan and the unsplit model simulated under a load (``flatpack bench sim``);
- :mod:`~bench.sim.live`: the live measurements (CPU from /proc, the invoke path, 1-client probes);
- :mod:`~bench.sim.calibration`: the fits of the simulation to them;
- :mod:`~bench.sim.validation`: the simulator against live runs (``flatpack bench sim --validate``).

Modules are imported by name; this package imports none of them.
"""

__all__: list[str] = []

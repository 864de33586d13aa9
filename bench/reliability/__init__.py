"""Reliability under load: faults injected into running instances (``flatpack bench chaos``) and a steady
load for many minutes (``flatpack bench soak``).

- :mod:`~bench.reliability.faults`: the fault injector, and how each request came out;
- :mod:`~bench.reliability.chaos`: the chaos run and its typed result;
- :mod:`~bench.reliability.soak`: the soak run and its typed result.

Modules are imported by name; this package imports none of them.
"""

__all__: list[str] = []

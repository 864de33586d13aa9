"""The performance model's parts, one concept a module (:mod:`partitioner.perfmodel` is their surface).

- :mod:`partitioner.perf.platform`: the platform's figures (invoke latency, CPU per memory, transfers, billing)
- :mod:`partitioner.perf.compute`: unit compute times at a function's vCPUs, memory per part
- :mod:`partitioner.perf.options`: stage choices, their costs and the exact solver's bounds
- :mod:`partitioner.perf.model`: :class:`~partitioner.perf.model.PerfModel`, the plan estimate
"""

__all__ = ["compute", "model", "options", "platform"]

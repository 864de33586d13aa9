"""The service profiler: measured time and memory of every unit and of the parts of split options.

Every model (a unit's stage model, or one part of a split option) is measured with onnxruntime in a
fresh process (:mod:`partitioner.measure_worker`) sized like the function that would run it: intra-op
threads from its vCPU share, one inter-op thread. The process reports warm-up-free run times (median and
p95 over ``reps`` runs after ``warmup`` runs), its peak resident memory (VmHWM: interpreter, numpy,
onnxruntime, inputs, weights and whatever onnxruntime allocates - measured, never summed from tensor
sizes), and the parent times its cold start (spawn to session ready: interpreter start, imports,
session creation).

Results are cached on disk as JSON (never pickle), keyed by the measured content (model sha256 plus
unit or part), thread count, repetitions, onnxruntime version and a machine fingerprint, so a second
profile of the same model measures nothing. Under a time budget the units that matter most (their share
of the model's FLOPs plus their share of its weights) are measured first and the rest is predicted
(``partitioner.predictors``) and marked ``measured=False``.

Thread counts above this machine's cores are not measured (the numbers would be a lie); they are
listed in ``GraphProfile.skipped_threads`` and left to the performance model to extrapolate.

Limits: timings are taken one process at a time (parallel measurements would disturb each other), but
anything else running on the machine still does; Linux-only peak memory (0 elsewhere).

Modules, one job each:

- :mod:`~partitioner.profile.types`: the values (``Measurement``, ``UnitProfile``, ``GraphProfile``);
- :mod:`~partitioner.profile.cache`: the on-disk cache and the machine fingerprint it is keyed by;
- :mod:`~partitioner.profile.measure`: the measuring processes (spawned, or forked from a fork server);
- :mod:`~partitioner.profile.units`: ``profile_graph``, every unit of a model;
- :mod:`~partitioner.profile.prediction`: the units a budget did not reach, predicted;
- :mod:`~partitioner.profile.split_options`: ``profile_options``, the parts of split options.
"""

from __future__ import annotations

from partitioner.profile.cache import ProfileCache, default_cache_dir, machine_info, model_sha256
from partitioner.profile.measure import MeasureError, measure_many, measure_model, runtime_base_mb
from partitioner.profile.split_options import profile_options
from partitioner.profile.types import GraphProfile, Measurement, ModelSource, OptionKey, ProgressFn, UnitProfile
from partitioner.profile.units import profile_graph

__all__ = [
    "GraphProfile",
    "MeasureError",
    "Measurement",
    "ModelSource",
    "OptionKey",
    "ProfileCache",
    "ProgressFn",
    "UnitProfile",
    "default_cache_dir",
    "machine_info",
    "measure_many",
    "measure_model",
    "model_sha256",
    "profile_graph",
    "profile_options",
    "runtime_base_mb",
]

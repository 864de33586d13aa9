"""Platform profiles: the facts about a serverless platform (AWS Lambda, OpenFaaS, the local platform)
that plans, the local platform and the deployers need, as data files with one loader.

Both the offline side (the partitioner's performance model) and the online side (the local platform's
meter, the deployers) read them, so they live apart from both and import nothing of flatpack's. So does
what they share about a profile's figures: the invoke latency's distribution (:class:`ExGauss`, fitted by
calibrate, evaluated by the performance model, drawn by the simulator) and the unit they count in (``MB``).
"""

from platforms.exgauss import ExGauss
from platforms.profile import (
    CPU_MODELS,
    MB,
    PROFILE_DIR,
    CpuModel,
    CpuModelName,
    MemoryRange,
    PlatformProfile,
    TransferCost,
    billed_ms,
    expected_billed_ms,
    load_profile,
    load_profile_data,
    profile_names,
    resolve_profile_path,
    threads_for,
    vcpus_for,
)

__all__ = ["CPU_MODELS", "MB", "PROFILE_DIR", "CpuModel", "CpuModelName", "ExGauss", "MemoryRange", "PlatformProfile",
           "TransferCost", "billed_ms", "expected_billed_ms", "load_profile", "load_profile_data", "profile_names",
           "resolve_profile_path", "threads_for", "vcpus_for"]

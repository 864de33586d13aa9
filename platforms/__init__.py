"""Platform profiles: the facts about a serverless platform (AWS Lambda, OpenFaaS, the local platform)
that plans, the local platform and the deployers need, as data files with one loader.

Both the offline side (the partitioner's performance model) and the online side (the local platform's
meter, the deployers) read them, so they live apart from both and import nothing of flatpack's.
"""

from platforms.profile import (
    CPU_MODELS,
    PROFILE_DIR,
    CpuModel,
    CpuModelName,
    InvokeLatency,
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

__all__ = ["CPU_MODELS", "PROFILE_DIR", "CpuModel", "CpuModelName", "InvokeLatency", "MemoryRange", "PlatformProfile",
           "TransferCost", "billed_ms", "expected_billed_ms", "load_profile", "load_profile_data", "profile_names",
           "resolve_profile_path", "threads_for", "vcpus_for"]

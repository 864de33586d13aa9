"""What a cloud function instance keeps while it lives: its runtime and its inference statistics.

Both cloud handlers (AWS Lambda, OpenFaaS) hold one :class:`Instance` at module level — the documented way
to keep state across the invocations an execution environment or replica serves. The runtime is built on
first use (:func:`functions.handlers.cold_start.start_runtime`); one that cannot start raises InitError
and is tried again on the next event; one that went over its memory is retired after its event, as the
platform would kill the instance, and the next event starts a fresh one.
"""

from __future__ import annotations

from collections.abc import Callable

from functions.handlers.cold_start import retire, start_runtime
from functions.inference_stats import InferenceStats
from functions.runtime import FunctionRuntime

__all__ = ["Instance"]


class Instance:
    """One function instance's state. ``start`` builds the runtime (default: from the process's environment)."""

    def __init__(self, start: Callable[[], FunctionRuntime] = start_runtime) -> None:
        self._start = start
        self.loaded: FunctionRuntime | None = None
        #: inference statistics (Triton's statistics extension), by model, as long as the instance lives
        self.stats: dict[str, InferenceStats] = {}

    def runtime(self) -> FunctionRuntime:
        """The runtime, built on first use. Raises InitError."""
        if self.loaded is None:
            self.loaded = self._start()
        return self.loaded

    @property
    def function(self) -> str | None:
        """The function's name once its runtime is loaded (for errors raised outside the runtime)."""
        return self.loaded.config.function if self.loaded is not None else None

    def after_event(self) -> None:
        """Retire a runtime that went over its memory; the next event starts a fresh one."""
        if self.loaded is not None and self.loaded.over_memory:
            retire(self.loaded)
            self.loaded = None

    def close(self) -> None:
        """Close the runtime, if one is loaded."""
        if self.loaded is not None:
            self.loaded.close()
            self.loaded = None

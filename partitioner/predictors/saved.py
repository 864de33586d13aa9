"""Where the profiler finds trained predictors: ``<cache root>/predictors/`` (``flatpack bench predictors``
saves them there)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from partitioner.predictors.boosted import MemoryPredictor, TimePredictor

__all__ = ["load_saved_predictors", "save_predictors"]

log = logging.getLogger(__name__)


def _saved_dir(cache_root: str | Path) -> Path:
    return Path(cache_root) / "predictors"


def save_predictors(cache_root: str | Path, time_predictor: TimePredictor, memory_predictor: MemoryPredictor,
                    *, meta: Mapping[str, Any] | None = None) -> Path:
    """Save a trained pair where :func:`partitioner.profile.profile_graph` looks for them."""
    d = _saved_dir(cache_root)
    time_predictor.save(d / "time.json")
    memory_predictor.save(d / "memory.json")
    (d / "meta.json").write_text(json.dumps(dict(meta or {}), indent=1))
    return d


def load_saved_predictors(cache_root: str | Path) -> tuple[TimePredictor, MemoryPredictor] | None:
    """The pair saved by :func:`save_predictors` under ``cache_root``, or None (none saved, or unreadable)."""
    d = _saved_dir(cache_root)
    if not (d / "time.json").is_file() or not (d / "memory.json").is_file():
        return None
    try:
        return TimePredictor.load(d / "time.json"), MemoryPredictor.load(d / "memory.json")
    except (OSError, ValueError, KeyError, ImportError) as e:
        log.warning("ignoring saved predictors in %s: %s", d, e)
        return None


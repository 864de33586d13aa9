"""The local platform's settings: FLATPACK_PLATFORM_* overrides, empty ones unset, bad ones named."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.platform.config import PlatformConfig


def test_overrides_are_typed_and_empty_ones_are_unset() -> None:
    cfg = PlatformConfig.from_env({"FLATPACK_PLATFORM_PORT": "9100", "FLATPACK_PLATFORM_IDLE_TIMEOUT_S": "2.5",
                                   "FLATPACK_PLATFORM_SHM_DIR": "/dev/shm/x", "FLATPACK_PLATFORM_PROFILE": "",
                                   "FLATPACK_PLATFORM_DEFAULT_CONCURRENCY": " "})
    assert (cfg.port, cfg.idle_timeout_s, cfg.shm_dir) == (9100, 2.5, Path("/dev/shm/x"))
    assert cfg.profile == PlatformConfig().profile and cfg.default_concurrency is None


def test_keyword_overrides_win_over_the_environment() -> None:
    cfg = PlatformConfig.from_env({"FLATPACK_PLATFORM_PORT": "9100"}, port=9200, host=None)
    assert cfg.port == 9200 and cfg.host == PlatformConfig().host


def test_a_bad_value_names_the_variable() -> None:
    with pytest.raises(ValueError, match="FLATPACK_PLATFORM_PORT='eighty'"):
        PlatformConfig.from_env({"FLATPACK_PLATFORM_PORT": "eighty"})

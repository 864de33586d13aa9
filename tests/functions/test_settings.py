"""functions.settings: one reader per FLATPACK_* setting, an empty value is an unset one, a bad value
is a ValueError naming the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from functions import settings
from functions.config import FunctionConfig


def test_defaults_apply_when_unset_or_empty(tmp_path: Path) -> None:
    home = Path.home()
    for env in ({}, {"FLATPACK_CACHE_DIR": "", "FLATPACK_STATE_DIR": "  ", "FLATPACK_API_TOKEN": "",
                     "FLATPACK_REDIS_URL": "", "FLATPACK_LOG_LEVEL": ""}):
        assert settings.cache_dir(env) == home / ".cache" / "flatpack"
        assert settings.state_dir(env) == home / ".local" / "state" / "flatpack"
        assert settings.api_token(env) is None
        assert settings.redis_url(env) == settings.DEFAULT_REDIS_URL
        assert settings.configured_redis_url(env) is None
        assert settings.log_level("INFO", env) == "INFO"
        assert settings.s3_bucket(env) is None and settings.openfaas_image(env) is None
        assert settings.openfaas_function_gateway(env) is None


def test_values_are_read(tmp_path: Path) -> None:
    env = {"FLATPACK_CACHE_DIR": str(tmp_path / "c"), "FLATPACK_STATE_DIR": str(tmp_path / "s"),
           "FLATPACK_API_TOKEN": "t0k", "FLATPACK_REDIS_URL": "redis://h:7/1", "FLATPACK_LOG_LEVEL": "debug"}
    assert settings.cache_dir(env) == tmp_path / "c"
    assert settings.state_dir(env) == tmp_path / "s"
    assert settings.api_token(env) == "t0k"
    assert settings.redis_url(env) == "redis://h:7/1"
    assert settings.log_level("WARNING", env) == "DEBUG"


@pytest.mark.parametrize(("var", "value", "reader"), [
    ("FLATPACK_CACHE_DIR", "FILE", settings.cache_dir),
    ("FLATPACK_STATE_DIR", "FILE", settings.state_dir),
    ("FLATPACK_REDIS_URL", "localhost:6379", settings.redis_url),
    ("FLATPACK_LOG_LEVEL", "loud", lambda env: settings.log_level("INFO", env)),
])
def test_a_bad_value_names_the_variable(tmp_path: Path, var: str, value: str, reader) -> None:  # noqa: ANN001
    if value == "FILE":
        (tmp_path / "f").write_text("")
        value = str(tmp_path / "f")
    with pytest.raises(ValueError, match=var):
        reader({var: value})


def test_a_functions_redis_url_is_read_by_the_same_reader() -> None:
    base = {"FLATPACK_BUNDLE_DIR": "/b", "FLATPACK_DEPLOYMENT": "d", "FLATPACK_FUNCTION": "f"}
    assert FunctionConfig.from_env({**base, "FLATPACK_REDIS_URL": ""}).redis_url == settings.DEFAULT_REDIS_URL
    assert FunctionConfig.from_env({**base, "FLATPACK_REDIS_URL": "redis://r:1/0"}).redis_url == "redis://r:1/0"
    with pytest.raises(ValueError, match="FLATPACK_REDIS_URL"):
        FunctionConfig.from_env({**base, "FLATPACK_REDIS_URL": "r:1"})

"""Secrets come from the environment or from mounted files, and never show in errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from pml_common.settings import SECRET_FILES, Settings, redis_credentials


def test_every_secret_can_come_from_a_file_and_the_file_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for secret, file_setting in SECRET_FILES.items():
        path = tmp_path / secret
        path.write_text(f"from-file-{secret}\n")  # the newline `echo` adds is dropped
        monkeypatch.setenv(f"PML_{secret.upper()}", "from-environment")
        monkeypatch.setenv(f"PML_{file_setting.upper()}", str(path))
    settings = Settings()
    for secret in SECRET_FILES:
        value = getattr(settings, secret)
        assert isinstance(value, SecretStr), secret
        assert value.get_secret_value() == f"from-file-{secret}"


def test_secrets_come_from_the_environment_without_files(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PML_NEO4J_PASSWORD", "neo-pw")
    monkeypatch.setenv("PML_REDIS_PASSWORD", "redis-pw")
    settings = Settings()
    assert settings.neo4j_password.get_secret_value() == "neo-pw"
    assert redis_credentials(settings) == {"password": "redis-pw"}
    assert "neo-pw" not in repr(settings)
    assert "redis-pw" not in repr(settings)


def test_an_unreadable_or_empty_secret_file_stops_the_start_with_its_setting_named(
    tmp_path: Path,
) -> None:
    with pytest.raises(ValidationError, match="neo4j_password_file: cannot read"):
        Settings(neo4j_password_file=str(tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ValidationError, match=r"auth_token_file: .* is empty"):
        Settings(auth_token_file=str(empty))


def test_errors_never_echo_secrets() -> None:
    with pytest.raises(ValidationError) as err:
        Settings(redis_url="redis://:in-url@127.0.0.1:6379/0", redis_password="hunter2-secret")
    assert "not both" in str(err.value)
    assert "hunter2-secret" not in str(err.value)
    assert "in-url" not in str(err.value)


def test_redis_credentials_only_name_what_is_set() -> None:
    assert redis_credentials(Settings()) == {}
    both = Settings(redis_username="pml", redis_password=SecretStr("pw"))
    assert redis_credentials(both) == {"username": "pml", "password": "pw"}


def test_a_longest_wait_shorter_than_the_quiet_period_is_refused_with_both_named() -> None:
    with pytest.raises(ValidationError, match=r"PML_TRAIN_MAX_WAIT_S \(2.0\).*PML_TRAIN_QUIET_S"):
        Settings(train_quiet_s=5.0, train_max_wait_s=2.0)
    assert Settings(train_quiet_s=5.0, train_max_wait_s=5.0).train_max_wait_s == 5.0

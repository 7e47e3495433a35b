"""Endpoint settings and keys: the environment first, then .streamlit/secrets.toml; shown only masked."""

from __future__ import annotations

import pytest

from kvlab.secrets import mask, read_setting, resolve_endpoint


@pytest.fixture
def secrets_file(tmp_path, monkeypatch):
    path = tmp_path / "secrets.toml"
    path.write_text('KVLAB_API_KEY = "sk-from-secrets-file-1234"\nKVLAB_BASE_URL = "http://10.0.0.5:8000/v1"\n')
    monkeypatch.setenv("KVLAB_SECRETS_FILE", str(path))
    for name in ("KVLAB_API_KEY", "KVLAB_BASE_URL", "KVLAB_MODEL_ID"):
        monkeypatch.delenv(name, raising=False)
    return path


def test_the_environment_wins_over_the_secrets_file(secrets_file, monkeypatch):
    assert read_setting("KVLAB_API_KEY") == ("sk-from-secrets-file-1234", f"KVLAB_API_KEY in {secrets_file}")
    monkeypatch.setenv("KVLAB_API_KEY", "sk-from-env-5678")
    assert read_setting("KVLAB_API_KEY") == ("sk-from-env-5678", "environment variable KVLAB_API_KEY")
    assert read_setting("NOT_SET_ANYWHERE") == (None, "not set")


def test_endpoint_fills_what_the_spec_leaves_out(secrets_file):
    endpoint = resolve_endpoint(None, "my-model")
    assert endpoint.base_url == "http://10.0.0.5:8000/v1" and endpoint.model_id == "my-model"
    assert endpoint.masked_key == "****1234"
    assert "sk-from-secrets" not in repr(endpoint)
    assert resolve_endpoint("http://127.0.0.1:9/v1", None).base_url == "http://127.0.0.1:9/v1"


def test_no_endpoint_anywhere_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KVLAB_SECRETS_FILE", str(tmp_path / "missing.toml"))
    monkeypatch.delenv("KVLAB_BASE_URL", raising=False)
    with pytest.raises(ValueError, match="KVLAB_BASE_URL"):
        resolve_endpoint(None, None)


@pytest.mark.parametrize("secret, shown", [(None, "(none)"), ("", "(none)"), ("short-key", "****"),
                                           ("sk-0123456789abcdef", "****cdef")])
def test_mask_never_shows_more_than_the_last_four(secret, shown):
    assert mask(secret) == shown

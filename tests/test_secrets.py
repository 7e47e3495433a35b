"""Endpoint settings and keys: the environment first, then .streamlit/secrets.toml; shown only masked."""

from __future__ import annotations

import logging
import sys

import pytest

from kvlab import secrets
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import parse_spec
from kvlab.core.urls import hide_credentials, strip_credentials, url_credentials
from kvlab.secrets import mask, read_setting, redact, redact_data, redact_record, remember_secret, resolve_endpoint


@pytest.fixture(autouse=True)
def forget_secrets(monkeypatch):
    """Secrets read by one test are not masked in the next."""
    monkeypatch.setattr(secrets, "_remembered", {})


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


# -- credentials in URLs and redaction (issue 9) -----------------------------------------------------

PASSWORD = "pa55-w0rd-for-tests"


@pytest.mark.parametrize("url, stripped, shown", [
    ("http://bob:pw@host:8000/v1", "http://host:8000/v1", "http://***@host:8000/v1"),
    ("https://sk-token@host/v1", "https://host/v1", "https://***@host/v1"),
    ("http://bob:p@ss/w@host/v1", "http://host/v1", "http://***@host/v1"),  # unescaped @ and / in the password
    ("bob:pw@host:8000/v1", "host:8000/v1", "***@host:8000/v1"),  # no scheme
    ("http://host:8000/v1", "http://host:8000/v1", "http://host:8000/v1"),
])
def test_credentials_are_taken_out_of_a_url_whole(url, stripped, shown):
    assert strip_credentials(url) == stripped and hide_credentials(url) == shown
    assert (url_credentials(url) is None) == (url == stripped)


def test_redact_removes_url_credentials_and_masks_known_secrets(monkeypatch):
    monkeypatch.setenv("SOME_SERVICE_TOKEN", "tok-0123456789abcdef")
    monkeypatch.setenv("KVLAB_DATABASE_URL", f"postgresql://kvlab:{PASSWORD}@db/kvlab")
    remember_secret("sk-remembered-0123456789")
    text = (f"GET http://u:{PASSWORD}@h/v1 failed; postgresql://kvlab:x@db/kvlab; got {PASSWORD}, "
            "tok-0123456789abcdef and sk-remembered-0123456789; mail me@example.com, see http://plain/v1@2")
    assert redact(text) == ("GET http://***@h/v1 failed; postgresql://***@db/kvlab; got ***, "
                            "****cdef and ****6789; mail me@example.com, see http://plain/v1@2")
    assert redact_data({"a": [f"x {PASSWORD}", 3, None], f"k {PASSWORD}": ("y",)}) == {"a": ["x ***", 3, None],
                                                                                        "k ***": ["y"]}


def test_short_values_are_not_masked_inside_words(monkeypatch):
    monkeypatch.setenv("MY_KEY", "pass")  # masking it would turn every "passkey" into "***key"
    assert redact("passkey at http://u:pass@h/v1") == "passkey at http://***@h/v1"


def test_an_endpoint_from_the_environment_drops_its_credentials(secrets_file, monkeypatch):
    monkeypatch.setenv("KVLAB_BASE_URL", f"http://bob:{PASSWORD}@10.0.0.7:8000/v1")
    endpoint = resolve_endpoint(None, None)
    assert endpoint.base_url == "http://10.0.0.7:8000/v1" and endpoint.dropped_credentials
    assert endpoint.api_key == "sk-from-secrets-file-1234"  # the key, not the URL's password, authenticates
    monkeypatch.delenv("KVLAB_BASE_URL")
    assert redact(f"echoed: {PASSWORD}") == "echoed: ***"  # remembered once read
    assert not resolve_endpoint("http://10.0.0.7:8000/v1", None).dropped_credentials


@pytest.mark.parametrize("where, field", [
    ({"backend": {"kind": "openai_compat", "base_url": f"http://bob:{PASSWORD}@h:8000/v1"}}, "backend.base_url"),
    ({"backend": {"kind": "openai_compat", "base_url": "http://h@x:8000/v1"}}, "backend.base_url"),
    ({"notes": f"served by https://bob:{PASSWORD}@gateway/v1"}, "notes"),
    ({"tags": ["a", f"ftp://bob:{PASSWORD}@files"]}, "tags.1"),
    ({"backend": {"kind": "vllm", "server": {"host": f"bob:{PASSWORD}@10.0.0.2"}}}, "backend.server.host"),
])
def test_a_spec_that_holds_url_credentials_is_refused_without_repeating_them(where, field):
    with pytest.raises(ConfigError) as refused:
        parse_spec({"tasks": [{"name": "passkey"}], "configs": [{"name": "baseline"}], **where})
    message = str(refused.value)
    assert message.startswith(f"{field}: ") and PASSWORD not in message and "\n" not in message


def test_log_records_are_redacted_with_their_arguments_and_traceback():
    try:
        raise ConnectionError(f"http://bob:{PASSWORD}@h/v1 is down")
    except ConnectionError:
        record = logging.LogRecord("kvlab", logging.ERROR, __file__, 1, "try %d of %s: %s", None, sys.exc_info())
    record.args = (2, f"http://bob:{PASSWORD}@h/v1", ValueError(f"http://bob:{PASSWORD}@h"))
    redact_record(record)
    line = logging.Formatter().format(record)
    assert "try 2 of http://***@h/v1: http://***@h" in line and "ConnectionError: http://***@h/v1" in line
    assert PASSWORD not in line


# -- which key may go to which URL (issue 47, rows 1 and 10) ------------------------------------------------------


@pytest.mark.parametrize("name", ["HOME", "KVLAB_DATABASE_URL", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "PATH",
                                  "kvlab_api_key", "API_KEY", "_API_KEY", "KVLAB_API_KEY ", ""])
def test_only_a_variable_named_like_a_key_is_read_as_one(secrets_file, monkeypatch, name):
    monkeypatch.setenv("KVLAB_DATABASE_URL", "postgresql://kvlab:db-password-123@db/kvlab")
    with pytest.raises(ValueError, match="is not a key variable: kvlab reads an API key only from a variable "
                                         "named <NAME>_API_KEY"):
        resolve_endpoint("http://127.0.0.1:9/v1", None, name)
    with pytest.raises(ValueError, match="is not a key variable"):
        secrets.key_for(name, "http://127.0.0.1:9/v1")


@pytest.mark.parametrize("name", ["KVLAB_API_KEY", "OPENAI_API_KEY", "MY_SERVER_2_API_KEY"])
def test_a_key_variable_is_named_name_api_key(name):
    assert secrets.key_var_problem(name) is None


def test_a_key_goes_only_to_the_origin_its_base_url_variable_declares(secrets_file, monkeypatch):
    """KVLAB_API_KEY belongs to KVLAB_BASE_URL's scheme, host and port (any path: the doctor corrects paths)."""
    choice = secrets.key_for("KVLAB_API_KEY", "http://10.0.0.5:8000/other/v1")
    assert choice.key == "sk-from-secrets-file-1234" and not choice.withheld
    for elsewhere in ("http://evil.example/v1", "https://10.0.0.5:8000/v1", "http://10.0.0.5:8001/v1",
                      "http://10.0.0.5.evil.example:8000/v1", "http://10.0.0.5:8000@evil.example/v1", "not a url"):
        withheld = secrets.key_for("KVLAB_API_KEY", elsewhere)
        assert withheld.key is None and "KVLAB_API_KEY belongs to http://10.0.0.5:8000 (KVLAB_BASE_URL)" in \
            withheld.withheld and "is not sent there" in withheld.withheld, elsewhere
        assert "KVLAB_BASE_URL" in withheld.fix and "type the key" in withheld.fix
    assert secrets.key_for("KVLAB_API_KEY", "HTTP://10.0.0.5:8000/v1").key  # scheme and host in any case
    monkeypatch.setenv("KVLAB_BASE_URL", "https://api.example.com/v1")
    assert secrets.key_for("KVLAB_API_KEY", "https://API.example.com:443/v2").key  # the default port written out
    monkeypatch.setenv("KVLAB_PLAYGROUND_URL", "http://127.0.0.1:8123")  # the playground's own server
    assert secrets.key_for("KVLAB_API_KEY", "http://127.0.0.1:8123/v1").key


def test_another_key_belongs_to_its_own_base_url_declared_in_the_secrets_file(secrets_file, monkeypatch):
    secrets_file.write_text('TEAM_API_KEY = "sk-team-key-abcdefgh"\nTEAM_BASE_URL = "https://llm.team.example/v1"\n')
    assert secrets.key_for("TEAM_API_KEY", "https://llm.team.example/v1").key == "sk-team-key-abcdefgh"
    assert secrets.key_for("TEAM_API_KEY", "http://127.0.0.1:8000/v1").key is None
    monkeypatch.setenv("LONE_API_KEY", "sk-lone-key-12345678")  # declared for no URL: sent nowhere from a page
    lone = secrets.key_for("LONE_API_KEY", "http://127.0.0.1:8000/v1")
    assert lone.key is None and "LONE_API_KEY is declared for no URL (LONE_BASE_URL)" in lone.withheld
    assert secrets.key_for("UNSET_API_KEY", "http://x/v1") == secrets.KeyChoice(None, "not set")


@pytest.mark.parametrize("name", ["KVLAB_BASE_URL", "KVLAB_PLAYGROUND_URL", "TEAM_BASE_URL", "KVLAB_DATABASE_URL"])
def test_reading_a_url_setting_masks_its_password_and_leaves_the_address_readable(monkeypatch, name):
    """key_for reads every <P>_BASE_URL; taking a whole URL for a key masked that address in every later
    message of the process (the doctor's "write it as ****0/v1")."""
    monkeypatch.setenv(name, "http://user:pa55word-xyz@127.0.0.1:8000/v1")
    read_setting(name)
    assert redact("write it as http://127.0.0.1:8000/v1") == "write it as http://127.0.0.1:8000/v1"
    assert "pa55word-xyz" not in redact("the password pa55word-xyz")

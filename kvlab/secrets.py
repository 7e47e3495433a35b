"""Where endpoint settings and API keys come from -- the environment or ``.streamlit/secrets.toml``.

Keys are read at the moment they are needed and never written anywhere: not into specs, the
database, logs, exports or share links.  Specs name the *variable* (``api_key_env``), never
the value.  :func:`mask` is the only form in which a key is ever shown.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

BASE_URL_VAR = "KVLAB_BASE_URL"
MODEL_ID_VAR = "KVLAB_MODEL_ID"
DEFAULT_KEY_VAR = "KVLAB_API_KEY"


def secrets_files() -> list[Path]:
    """The secrets files Streamlit itself reads, most specific first (``KVLAB_SECRETS_FILE`` overrides)."""
    if os.environ.get("KVLAB_SECRETS_FILE"):
        return [Path(os.environ["KVLAB_SECRETS_FILE"])]
    return [Path.cwd() / ".streamlit" / "secrets.toml", Path.home() / ".streamlit" / "secrets.toml"]


def _from_secrets_file(name: str) -> tuple[str, str] | None:
    for path in secrets_files():
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError):
            continue
        value = data.get(name)
        if isinstance(value, str):
            return value, str(path)
    return None


def read_setting(name: str) -> tuple[str | None, str]:
    """``(value, where it came from)``: the environment variable ``name``, else the top-level key
    ``name`` of the secrets file; ``(None, "not set")`` when neither has it."""
    if os.environ.get(name) is not None:
        return os.environ[name], f"environment variable {name}"
    found = _from_secrets_file(name)
    if found:
        return found[0], f"{name} in {found[1]}"
    return None, "not set"


def mask(secret: str | None) -> str:
    """A key as it may be shown: its last 4 characters, never more than a quarter of it."""
    if not secret:
        return "(none)"
    tail = secret.strip()[-4:] if len(secret.strip()) >= 16 else ""
    return f"****{tail}"


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible endpoint as a client needs it.  ``repr`` never shows the key."""

    base_url: str
    model_id: str | None
    api_key: str | None = field(repr=False)
    key_source: str  # "environment variable KVLAB_API_KEY", "... in .streamlit/secrets.toml", "not set"

    @property
    def masked_key(self) -> str:
        return mask(self.api_key)


def resolve_endpoint(base_url: str | None, model_id: str | None, api_key_env: str = DEFAULT_KEY_VAR) -> Endpoint:
    """Fill what the spec leaves out from ``KVLAB_BASE_URL`` / ``KVLAB_MODEL_ID`` and read the key
    from ``api_key_env`` (environment first, then the secrets file)."""
    base_url = base_url or read_setting(BASE_URL_VAR)[0]
    if not base_url:
        raise ValueError(f"no endpoint: set backend.base_url in the spec or {BASE_URL_VAR} in the environment "
                         "or .streamlit/secrets.toml (for example http://127.0.0.1:8000/v1)")
    model_id = model_id or read_setting(MODEL_ID_VAR)[0]
    key, source = read_setting(api_key_env)
    return Endpoint(base_url=base_url, model_id=model_id, api_key=key, key_source=source)

"""Which environment variables may hold an API key: the naming rule every front end applies.

It lives in the bottom layer because a spec validates ``api_key_env`` with it
(:mod:`kvlab.core.experiment_spec`); reading keys and sending them is :mod:`kvlab.secrets`.
"""

from __future__ import annotations

import re

DEFAULT_KEY_VAR = "KVLAB_API_KEY"
#: The only names a variable holding an API key may have (environment or secrets file): ``<P>_API_KEY``, upper
#: case.  ``HOME``, ``KVLAB_DATABASE_URL`` or a cloud token are never read as a key (:func:`key_var_problem`).
KEY_VAR_NAME = re.compile(r"[A-Z][A-Z0-9_]*_API_KEY")


def key_var_problem(name: str) -> str | None:
    """Why ``name`` may not be read as an API key (None when it may): only ``<P>_API_KEY`` variables hold keys,
    so that no page, link or spec can have kvlab send ``HOME``, ``KVLAB_DATABASE_URL`` or any other setting."""
    if KEY_VAR_NAME.fullmatch(name):
        return None
    shown = name if re.fullmatch(r"[A-Za-z0-9_]{1,60}", name) else repr(name[:60])
    return (f"{shown} is not a key variable: kvlab reads an API key only from a variable named <NAME>_API_KEY "
            f"(upper case, e.g. {DEFAULT_KEY_VAR} or OPENAI_API_KEY) in the environment or .streamlit/secrets.toml")

"""Credentials inside URLs (``http://user:password@host/v1``): found, stripped and hidden.

A spec that holds one is refused (:func:`kvlab.core.experiment_spec.refuse_credentials`); the
rest of secret handling (keys, redaction) is :mod:`kvlab.secrets`.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

#: ``scheme://userinfo@`` in free text; userinfo may hold ``@`` and ``:`` (the last ``@`` before the
#: host ends it), never whitespace, quotes or the path.
URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^\s/?#'\"<>]*@")
HIDDEN = "***"


def _userinfo_span(url: str) -> tuple[int, int] | None:
    """Where the user:password of a URL (or of ``host:port/path`` without a scheme) lies.

    Everything between ``://`` and the *last* ``@`` counts: an unescaped ``@`` or ``/`` in a
    password must not leave a piece of it behind, and a base URL has no other use for ``@``.
    """
    start = url.find("://")
    start = 0 if start < 0 else start + 3
    end = url.rfind("@")
    return (start, end) if end >= start else None


def url_credentials(url: str) -> str | None:
    """The ``user:password`` part of a URL, or None when it has none."""
    span = _userinfo_span(url)
    return url[span[0]:span[1]] if span else None


def strip_credentials(url: str) -> str:
    """The URL without its ``user:password@`` part."""
    span = _userinfo_span(url)
    return url[:span[0]] + url[span[1] + 1:] if span else url


def hide_credentials(url: str) -> str:
    """The URL as it may be shown: its ``user:password@`` part (if any) as ``***@``."""
    span = _userinfo_span(url)
    return url[:span[0]] + f"{HIDDEN}@" + url[span[1] + 1:] if span else url


def url_passwords(url: str) -> set[str]:
    """The password of ``url`` as written and percent-decoded (the user name when there is no
    password: a token is often written as one); empty when the URL has no credentials."""
    userinfo = url_credentials(url)
    if not userinfo:
        return set()
    password = userinfo.partition(":")[2] or userinfo
    return {password, unquote(password)}

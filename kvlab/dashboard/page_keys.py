"""The API key a dashboard page sends (the endpoint doctor's check, the playground's Run on an endpoint), and the
line that says which and where, before anything is sent.

The rule itself is :func:`kvlab.secrets.key_for` (which variable may be read as a key, which URL it may go to);
here only what a page adds to it: a key the user typed goes with that request, wherever it is aimed (it is the
user's own), and is never kept beyond the browser tab's session (not in the link, a log or the store).
"""

from __future__ import annotations

from kvlab.dashboard.formatting import md
from kvlab.secrets import KeyChoice, key_for, mask

#: Where a typed key comes from, as the page and the doctor's report say it.
TYPED = "typed on this page"
#: The typed-key field's help, the same on every page that has one.
TYPED_HELP = ("Your own key: sent with this request to the URL above, kept by this browser tab only, never in a "
              "link, a log or the store. Empty: the key variable's, sent only to the URL it belongs to.")


def page_key(var: str, url: str, typed: str = "") -> KeyChoice:
    """The key a page's request to ``url`` carries: the typed one (stripped), else the variable's where it may go
    (:func:`kvlab.secrets.key_for`; ``ValueError`` for a variable that holds no key); none for no variable."""
    if typed.strip():
        return KeyChoice(typed.strip(), TYPED)
    return key_for(var, url) if var else KeyChoice(None, "not set")


def key_caption(var: str, url: str, typed: str = "") -> str:
    """One line (Markdown) saying which key a request to ``url`` will carry, or why none."""
    try:
        choice = page_key(var, url, typed)
    except ValueError as error:
        return f"Key: none. {md(str(error))}."
    if choice.key:
        sent = "sent with this request only" if choice.source == TYPED else "sent to this URL, the one it belongs to"
        return f"Key: `{mask(choice.key)}` ({md(choice.source)}), {sent}."
    if choice.withheld:
        return f"Key: none sent. {md(choice.withheld)}; {md(choice.fix)}."
    return (f"Key: none. {md(var or 'The key variable')} is not set in the environment or .streamlit/secrets.toml "
            "(fine for a server that needs no key).")

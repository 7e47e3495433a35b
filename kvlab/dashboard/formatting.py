"""Text and URL state the dashboard's pages share: store text as literal Markdown, numbers, memory in MiB, the
accuracy margin, times in the viewer's zone and durations; ids, the tradeoff chart's axes and query parameters
in and out of the URL (the share link).

Nothing here imports streamlit, so the pages stay thin and these functions are tested directly.
Every view keeps its state in the URL's query parameters (the page itself is the URL path, its row's
in kvlab.dashboard.page_table), so a link opened in another browser shows the same view.  Where an experiment
stands, as the list and its own page both say it, is experiment_status; what only one page uses is in that
page's module: experiment_view, experiments_list, compare_view.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, tzinfo
from typing import Any, TypeGuard
from urllib.parse import urlencode
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from kvlab.analysis.summary import ConfigSummary
from kvlab.core.margins import Margins
from kvlab.core.units import MIB

#: Memory is in MiB (2^20 bytes) on every page, export and CLI table: :func:`fmt_mib`.

MAX_ID = 2**63 - 1  # the largest id a database column holds

X_AXES = ("bytes", "ratio")
#: The tradeoff chart's y metrics (its ``y`` query parameter, the first the default), with the words
#: a title uses for each: the accuracy, or the fidelity to the baseline (mean KL, top-1 agreement).
Y_METRICS = {"accuracy": "accuracy", "KL": "mean KL", "agreement": "top-1 agreement"}


def url_number(value: float) -> str:
    """A number as a bound number widget writes it into the URL (Streamlit's form: 5.0 -> ``5``)."""
    return str(int(value)) if math.isfinite(value) and value == int(value) else repr(value)


#: Markdown's inline markup (links, images, emphasis, code, math, ``:colour[...]:`` and shortcodes, raw
#: HTML, autolinked URLs and addresses), and what only means something at the start of a line.
_MD_INLINE = re.compile(r"([\\`*_{}\[\]()<>!|~$:.@])")
_MD_LINE_START = re.compile(r"(?m)^([ \t]*)([-+#=])")


def md(text: str) -> str:
    """Text from the store or a server (names, tags, notes, messages) as literal Markdown: Streamlit
    renders ``[a](url)`` as a link, ``![](url)`` as an image it fetches, ``:red[...]`` as colour,
    ``www.x.org`` as a link, and names may hold any of them.  A dash or a plus inside a line stays
    as it is (``synthetic-sweep``)."""
    return _MD_LINE_START.sub(r"\1\\\2", _MD_INLINE.sub(r"\\\1", text))


def code_span(text: str) -> str:
    """``text`` as Markdown inline code (selectable, copied whole), fenced by more backticks than it
    holds in a row, so that a backtick in a name cannot end the span."""
    fence = "`" * (1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def parse_int(value: str | None) -> int | None:
    """An id from the URL, or None for anything that is not a positive integer a database id can be."""
    try:
        number = int(str(value).strip())
    except (TypeError, ValueError):
        return None
    return number if 0 < number <= MAX_ID else None


def query_values(params: Mapping[str, str | int | Sequence[str | int] | None]) -> dict[str, list[str]]:
    """A view's query parameters as a URL carries them: each non-empty one's values as text (None, ``""`` and
    empty lists left out).  The share link (:func:`share_url`) and the address bar (``pages.common.address_bar``)
    both come from this."""
    query: dict[str, list[str]] = {}
    for key, value in params.items():
        if value is None or value == "" or (isinstance(value, (list, tuple)) and not value):
            continue
        query[key] = [str(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    return query


def share_url(base: str | None, params: Mapping[str, str | int | Sequence[str | int] | None]) -> str:
    """The link that reopens this view: ``base`` (the page's URL, no query) plus the non-empty params."""
    encoded = urlencode(query_values(params), doseq=True)
    return f"{base or ''}?{encoded}" if encoded else (base or "")


# -- formatting ---------------------------------------------------------------------------------

def is_missing(value: float | None) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def is_present(value: float | None) -> TypeGuard[float]:
    """Not :func:`is_missing`: a number (the type checker then knows it is one)."""
    return not is_missing(value)


def fmt(value: float | None, spec: str, scale: float = 1.0, suffix: str = "") -> str:
    return format(value * scale, spec) + suffix if is_present(value) else "-"


def fmt_mib(n_bytes: float | None, spec: str = ".3f") -> str:
    """Bytes as MiB, the one memory unit of the pages: ``12.345 MiB`` ("-" when unknown)."""
    return fmt(n_bytes, spec, 1 / MIB, " MiB")


def fmt_margin(max_drop: float) -> str:
    """The accuracy margin as pages write it: a fraction (``0.05``), as accuracy is and the spec stores it (its
    inputs: :mod:`kvlab.core.margin_inputs`)."""
    return f"{max_drop:g}"


def margins_label(spec: Mapping[str, Any]) -> str:
    """A stored spec's margins in a line: ``max_drop 0.05, max_kl 0.05, min_agreement off``."""
    margins = Margins.of(spec)
    kl = f"{margins.max_kl:g}" if margins.max_kl > 0 else "off"
    agreement = f"{margins.min_agreement:g}" if margins.min_agreement > 0 else "off"
    return f"max_drop {margins.max_drop:g}, max_kl {kl}, min_agreement {agreement}"


def viewer_zone(name: str | None) -> tuple[tzinfo, str]:
    """The zone of the viewer's browser by its IANA name (Streamlit's ``st.context.timezone``) and that
    name; UTC when the browser did not say or named a zone this Python does not know."""
    if name:
        try:
            return ZoneInfo(name), name
        except (ZoneInfoNotFoundError, ValueError):
            pass
    return UTC, "UTC"


def fmt_time(moment: datetime | None, zone: tzinfo = UTC) -> str:
    """``2026-01-31 13:05`` in ``zone`` (a naive datetime is the store's UTC); "-" for none."""
    if moment is None:
        return "-"
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(zone).strftime("%Y-%m-%d %H:%M")


def fmt_duration(seconds: float | None) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min``."""
    if not is_present(seconds) or seconds < 0:
        return "-"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def fidelity_text(s: ConfigSummary) -> str:
    """``mean KL 0.0123 [0.01, 0.015] nats, top-1 agreement 97.0% [95%, 99%]`` ("" when not measured)."""
    if s.mean_kl is None:
        return ""
    return f"mean KL {kl_text(s)} nats, top-1 agreement {agreement_text(s)}"


def kl_text(s: ConfigSummary) -> str:
    return f"{s.mean_kl:.3g} [{s.kl_ci_low:.3g}, {s.kl_ci_high:.3g}]"


def agreement_text(s: ConfigSummary) -> str:
    return f"{s.agreement:.1%} [{s.agreement_ci_low:.0%}, {s.agreement_ci_high:.0%}]"

"""The widgets of a sweep's grid and a tune's space, one per axis they list, drawn from
:func:`kvlab.dashboard.spec_form.grid_widgets` (the axes table and the grid models): a new axis gets its
widget here without a line of this file changing.  Not a page."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import streamlit as st

from kvlab.core.formats import FORMATS
from kvlab.dashboard.spec_form import GridWidget, grid_widgets

#: Widgets per row.
PER_ROW = 4


def formats_reading(setting: str) -> str:
    """The formats whose storage reads ``setting`` (the format registry's declaration), for a label."""
    return ", ".join(name for name, fmt in FORMATS.items() if any(s.field == setting for s in fmt.settings))


def _draw(widget: GridWidget, key: str) -> None:
    label = widget.title + (f" ({formats_reading(widget.axis.field)})" if widget.axis.applies == "setting" else "")
    text = widget.help
    if widget.kind == "multiselect":
        st.multiselect(label, list(widget.options), key=key, help=text)
    elif widget.kind == "numbers":
        st.text_input(label, key=key, help=f"Comma-separated. {text}")
    elif widget.kind == "select":
        st.selectbox(label, list(widget.options), key=key, help=text)
    elif widget.kind == "number":
        st.number_input(label, min_value=0, step=1, key=key, help=text)
    else:
        st.checkbox(label, key=key, help=text)


def grid_inputs(table: str, prefix: str, slot: Callable[[str], None], base: Mapping[str, Any]) -> None:
    """Draw ``table``'s ("sweep" or "tune") widgets, ``prefix`` before each key, each followed by its
    messages' ``slot``; the lists of tables the form has no widget for (``base``'s, carried) are shown."""
    widgets = grid_widgets(table)
    drawn = [w for w in widgets if w.kind != "carried"]
    for start in range(0, len(drawn), PER_ROW):
        for column, widget in zip(st.columns(PER_ROW), drawn[start:start + PER_ROW], strict=False):
            with column:
                _draw(widget, f"{prefix}{table}.{widget.key}")
                slot(f"{table}.{widget.key}")
    for widget in widgets:
        if widget.kind == "carried" and (carried := base.get(widget.key)):
            st.caption(f"{widget.title} from the spec (kept as they are; edit them in the TOML): {carried}")

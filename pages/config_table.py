"""The KV-cache configs table's columns, as the new-experiment form and the playground both edit it: one
config per row, a column per leaf of the axes table (:data:`kvlab.core.axes.LEAVES`), its widget, bounds,
default and help read from there.  Not a page."""

from __future__ import annotations

from typing import Any

import streamlit as st

from kvlab.core.axes import CONFIG_COLUMNS, LEAVES, Leaf
from kvlab.dashboard.spec_form import BUDGET_STEP

#: The columns a reader looks for first, in view when the table opens: what a config is called, how it evicts
#: and at what budget, and how it quantizes; the other settings follow, in the axes table's order.
FIRST_COLUMNS = ("name", "evict", "ratio", "quant")


def column_order(with_name: bool = True) -> tuple[str, ...]:
    """``st.data_editor``'s ``column_order`` for the configs table (``with_name``: the form's, which names its
    configs; the playground labels them by their settings)."""
    first = tuple(c for c in FIRST_COLUMNS if with_name or c != "name")
    return first + tuple(c for c in CONFIG_COLUMNS if c not in FIRST_COLUMNS)


def _column(leaf: Leaf) -> Any:
    """The ``st.column_config`` of one leaf: a choice as a select box, a number with its bounds (strict
    bounds one step inside), yes/no as a checkbox, text and index lists as text."""
    text = (leaf.axis.form_help if leaf.column == leaf.axis.field else "") or leaf.help
    default = leaf.default if leaf.default not in (None, ()) else None
    if leaf.kind == "choice":
        return st.column_config.SelectboxColumn(leaf.title, options=list(leaf.choices), default=default, help=text)
    if leaf.kind == "bool":
        return st.column_config.CheckboxColumn(leaf.title, default=bool(default), help=text)
    if leaf.kind in ("int", "float"):
        step = 1 if leaf.kind == "int" else (BUDGET_STEP if leaf.high == 1 else 0.05)
        low = None if leaf.low is None else leaf.low + step * leaf.low_open
        high = None if leaf.high is None else leaf.high - step * leaf.high_open
        return st.column_config.NumberColumn(leaf.title, min_value=low, max_value=high, step=step, default=default,
                                             help=text)
    return st.column_config.TextColumn(leaf.title, help=text)


def config_columns() -> dict[str, Any]:
    """``st.data_editor``'s ``column_config`` for the configs table."""
    return {leaf.column: _column(leaf) for leaf in LEAVES if leaf.axis.column}

"""The widgets of a task's own parameters, one per field of its parameter model
(:func:`kvlab.dashboard.task_params.param_widgets`), for the new-experiment form and the playground: a new
task's parameters get their widgets here without a line of this file changing.  Not a page."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import streamlit as st

from kvlab.dashboard.task_params import UNSET_CHOICE, ParamWidget

#: Widgets per row.
PER_ROW = 4
_FROM_STATE = object()  # a widget whose value is the session state's (the form's)


def param_input(widget: ParamWidget, key: str, value: Any = _FROM_STATE) -> Any:
    """Draw ``widget`` under ``key``, at ``value`` (a spec value) or, without one, at its session state's;
    return what it holds.  Not for a file (the page has its own file field)."""
    given: dict[str, Any] = {} if value is _FROM_STATE else {"value": widget.shown(value)}
    if widget.kind in ("int", "float"):
        cast = int if widget.kind == "int" else float
        low, high = widget.bounds
        return st.number_input(widget.label, min_value=None if low is None else cast(low),
                               max_value=None if high is None else cast(high),
                               step=None if widget.step is None else cast(widget.step),
                               key=key, help=widget.help + (" 0: the task's default." if widget.optional else ""),
                               **given)
    if widget.kind == "bool":
        return st.checkbox(widget.label, key=key, help=widget.help, **given)
    if widget.kind == "choice":
        return st.selectbox(widget.label, widget.choices, key=key, help=widget.help,
                            index=widget.choices.index(given["value"]) if given else 0,  # 0: Streamlit's default
                            format_func=lambda option: "(default)" if option == UNSET_CHOICE else str(option))
    help_text = f"Comma-separated. {widget.help}" if widget.kind == "numbers" else widget.help
    return st.text_input(widget.label, key=key, help=help_text, **given)


def form_param_inputs(widgets: Sequence[ParamWidget], page: str, section: str, slot: Callable[[str], None],
                      file_field: Callable[[str, ParamWidget], None]) -> None:
    """Draw the form's widgets of a task's parameters, each keyed ``page`` + ``section`` + its name (``f:`` +
    ``tasks.0.`` + ``num_pairs``; a state not set yet, as when the task was just picked, at its default) and
    followed by its messages' ``slot`` (``section`` + its name); a file's widget is the page's
    ``file_field(key, widget)``."""
    for widget in widgets:
        st.session_state.setdefault(page + section + widget.name, widget.shown(widget.default))
    inline = [w for w in widgets if w.kind != "file"]
    for start in range(0, len(inline), PER_ROW):
        for column, widget in zip(st.columns(PER_ROW), inline[start:start + PER_ROW], strict=False):
            with column:
                param_input(widget, page + section + widget.name)
                slot(section + widget.name)
    for widget in widgets:
        if widget.kind == "file":
            file_field(page + section + widget.name, widget)
            slot(section + widget.name)


def item_param_inputs(widgets: Sequence[ParamWidget], prefix: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """Draw the playground's widgets of a task's parameters, each at ``given``'s value (a link's) or its default,
    and return their values as the spec's (a text that is not what its field takes is said under it and left
    out)."""
    values: dict[str, Any] = {}
    for start in range(0, len(widgets), PER_ROW):
        for column, widget in zip(st.columns(PER_ROW), widgets[start:start + PER_ROW], strict=False):
            with column:
                held = param_input(widget, prefix + widget.name, given.get(widget.name, widget.default))
                try:
                    values[widget.name] = widget.parsed(held)
                except ValueError as error:
                    st.error(str(error), icon=":material/error:")
    return {name: value for name, value in values.items() if value is not None}

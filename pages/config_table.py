"""The KV-cache configs table's columns, as the new-experiment form and the playground both edit it: one
config per row, every field of :class:`kvlab.core.kv_config.KVCacheConfig` a column
(:data:`kvlab.dashboard.spec_form.CONFIG_COLUMNS`), with its widget, bounds and help.  Not a page."""

from __future__ import annotations

from typing import Any

import streamlit as st

from kvlab.core.formats import DEFAULT_GROUP_SIZE, DEFAULT_RESIDUAL_LENGTH, GROUP_SIZES, MAX_RESIDUAL_LENGTH
from kvlab.core.kv_config import EVICTION_METHODS, QUANT_DTYPES
from kvlab.core.methods import BUDGETS, DEFAULT_ALPHA_SAFEGUARD, HEAD_BUDGETS, UNIFORM_HEADS
from kvlab.dashboard.spec_form import BUDGET_RANGE, BUDGET_STEP, CONFIG_LABELS, HEADS_HELP


def config_columns() -> dict[str, Any]:
    """``st.data_editor``'s ``column_config`` for the configs table."""
    return {
        "name": st.column_config.TextColumn("name", help="optional; derived from the settings if blank"),
        "quant": st.column_config.SelectboxColumn("quant", options=list(QUANT_DTYPES), default="none",
                                                  help="the keys' and values' format (the keys' alone when "
                                                       "value quant is set)"),
        "value_quant": st.column_config.SelectboxColumn(
            CONFIG_LABELS["value_quant"], options=list(QUANT_DTYPES),
            help="store values in another format than keys, e.g. keys int8 and values int4 (KIVI: keys need "
                 "more care); blank: as quant"),
        "skipped_first": st.column_config.NumberColumn(CONFIG_LABELS["skipped_first"], min_value=0, step=1,
                                                    help="keep the first N layers' cache 16-bit"),
        "skipped_last": st.column_config.NumberColumn(CONFIG_LABELS["skipped_last"], min_value=0, step=1,
                                                   help="keep the last N layers' cache 16-bit"),
        "skipped_layers": st.column_config.TextColumn(
            CONFIG_LABELS["skipped_layers"], help="comma-separated layer indices kept 16-bit (vLLM's "
                                               "--kv-cache-dtype-skip-layers), e.g. 0, 5"),
        "group_size": st.column_config.SelectboxColumn(CONFIG_LABELS["group_size"], options=list(GROUP_SIZES),
                                                       default=DEFAULT_GROUP_SIZE),
        "residual_length": st.column_config.NumberColumn(CONFIG_LABELS["residual_length"], min_value=0,
                                                         max_value=MAX_RESIDUAL_LENGTH, step=1,
                                                         default=DEFAULT_RESIDUAL_LENGTH),
        "evict": st.column_config.SelectboxColumn("evict", options=list(EVICTION_METHODS), default="none",
                                                  help="the budgets each method accepts: `kvlab methods`"),
        **{budget: st.column_config.NumberColumn(CONFIG_LABELS[budget], min_value=BUDGET_RANGE[0],
                                                 max_value=BUDGET_RANGE[1], step=BUDGET_STEP,
                                                 help=BUDGETS[budget].help)
           for budget in BUDGETS if not BUDGETS[budget].integer},
        **{budget: st.column_config.NumberColumn(CONFIG_LABELS[budget], min_value=1,
                                                 max_value=int(BUDGETS[budget].high) - 1, step=1,
                                                 help=BUDGETS[budget].help)
           for budget in BUDGETS if BUDGETS[budget].integer},
        "heads": st.column_config.SelectboxColumn(CONFIG_LABELS["heads"], options=list(HEAD_BUDGETS),
                                                  default=UNIFORM_HEADS, help=HEADS_HELP),
        "alpha_safeguard": st.column_config.NumberColumn(
            CONFIG_LABELS["alpha_safeguard"], min_value=0.0, max_value=1.0, step=0.05,
            default=DEFAULT_ALPHA_SAFEGUARD, help="with a head-wise budget: the least share of an equal split "
                                                  "each head keeps (kvpress's alpha_safeguard)"),
        "query_aware": st.column_config.CheckboxColumn(CONFIG_LABELS["query_aware"], default=False),
        "decode_interval": st.column_config.NumberColumn(
            CONFIG_LABELS["decode_interval"], min_value=1, step=1,
            help="compress during generation too (kvpress's DecodingPress): every this many forward passes, "
                 "the evict method scores the whole cache; with it, the prompt budget is optional"),
        "decode_target_tokens": st.column_config.NumberColumn(
            CONFIG_LABELS["decode_target_tokens"], min_value=1, step=1,
            help="... and cuts it back to this many tokens (or give a ratio)"),
        "decode_ratio": st.column_config.NumberColumn(
            CONFIG_LABELS["decode_ratio"], min_value=BUDGET_RANGE[0], max_value=BUDGET_RANGE[1],
            step=BUDGET_STEP, help="... or removes this fraction of all tokens seen so far"),
        "decode_buffer": st.column_config.NumberColumn(
            CONFIG_LABELS["decode_buffer"], min_value=0, step=1,
            help="hidden states of the last passes the scorer reads (default 256)"),
    }

"""The new-experiment form's capacity preview: what each config of the spec being built would fit on a GPU, projected
from its layout before anything runs (:mod:`kvlab.dashboard.capacity_view`; the experiment page's Capacity section
sets the same projection beside what the experiment measured)."""

from __future__ import annotations

import streamlit as st

from kvlab.capacity.gpus import GPUS
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import ExperimentSpec
from kvlab.dashboard import capacity_view, formatting
from kvlab.dashboard.capacity_view import architecture


def capacity_preview(spec: ExperimentSpec) -> None:
    """A popover (drawn by the browser only when opened) with the model, GPU, context and sequences at once, and each
    config's projected sequences beside the baseline's.  It never takes the form down: what fails in it is said in
    one line inside it (in a full test run, a model loading in another thread of the dashboard left transformers
    half-imported for the projection once: "cannot import name 'AutoConfig'")."""
    with st.popover("Capacity on a GPU (projection)", icon=":material/memory:",
                    help="What each config would fit on a GPU, computed from its layout before anything runs"):
        models = capacity_view.model_choices(spec.model)
        gpus = list(GPUS)
        model_col, gpu_col, context_col, clients_col = st.columns(4)
        model = model_col.selectbox("Model", models, key="form-cap-model",
                                    help="The spec's model, or a well-known architecture (its real geometry, sliding "
                                         "layers included): `kvlab capacity --help`.")
        gpu = gpu_col.selectbox("GPU", gpus, index=gpus.index(capacity_view.DEFAULT_GPU), key="form-cap-gpu",
                                format_func=lambda name: GPUS[name].title)
        try:
            arch = architecture(model)
        except (ImportError, ConfigError, OSError, ValueError) as error:
            st.warning(f"No projection now: {formatting.md(str(error))}", icon=":material/warning:")
            return
        context = int(context_col.number_input("Tokens per sequence", 1, capacity_view.MAX_CONTEXT, step=1024,
                                               key="form-cap-context", value=capacity_view.default_context(arch)))
        clients = int(clients_col.number_input("Sequences at once", 1, 100_000, step=1, key="form-cap-clients",
                                               value=capacity_view.DEFAULT_CONCURRENCY))
        choice = capacity_view.CapacityChoice(model, gpu, context, clients)
        pool, rows = capacity_view.planned_rows(spec.all_configs(), spec.backend.kind, choice)
        st.caption(formatting.md(capacity_view.pool_text(pool, arch.title, choice)))
        st.dataframe(rows, hide_index=True, key="form-capacity-table")
        st.caption("After the run, the experiment page's Capacity section sets this beside the compression it "
                   "measured; a [load] table measures throughput under load on a serving engine.")

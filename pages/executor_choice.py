"""The executor widget of the new-experiment page (the logic: :mod:`kvlab.dashboard.executor_form`)."""

from __future__ import annotations

import os

import streamlit as st

from kvlab.dashboard.executor_form import LABELS, Executor, probe_cluster, ray_missing, store_problem


@st.cache_data(ttl=30, show_spinner="Asking the Ray cluster for its resources…")
def cluster_resources(address: str) -> dict[str, float] | str:
    return probe_cluster(address)


def executor_choice() -> Executor:
    """Local workers or a Ray cluster; with Ray, its address and resources (Launch waits for a usable one)."""
    kind = st.radio("Executor", list(LABELS), format_func=LABELS.get, horizontal=True, key="executor",
                    help="A Ray cluster runs one kvlab worker per node, each keeping the model loaded; results go "
                         "to this dashboard's database.")
    if kind == "local":
        return Executor()
    missing = ray_missing()
    if missing:
        st.error(missing, icon=":material/error:")
        return Executor("ray", problem=missing)
    address = st.text_input("Ray address", value=os.environ.get("RAY_ADDRESS", "auto"), key="ray_address",
                            help="auto (a cluster started on this machine with `ray start --head`), HOST:PORT, "
                                 "or ray://HOST:10001").strip() or "auto"
    cluster = cluster_resources(address)
    if isinstance(cluster, str):
        st.error(cluster, icon=":material/error:")
        return Executor("ray", address, cluster)
    nodes_col, cpus_col, gpus_col = st.columns(3)
    nodes_col.metric("Nodes", int(cluster["nodes"]))
    cpus_col.metric("CPUs", f"{cluster['cpus']:g}")
    gpus_col.metric("GPUs", f"{cluster['gpus']:g}")
    problem = store_problem(int(cluster["nodes"]))
    if problem:
        st.error(problem, icon=":material/error:")
    return Executor("ray", address, problem)

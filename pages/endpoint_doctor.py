"""Endpoint doctor: check an OpenAI-compatible endpoint step by step (``kvlab.doctor``), each
problem with its fix.

The key is read from the environment or ``.streamlit/secrets.toml`` under the variable named on the page --
only a ``<NAME>_API_KEY`` variable, and sent only to the URL its ``<NAME>_BASE_URL`` declares
(:func:`kvlab.secrets.key_for`): a visitor of a dashboard served to a team cannot have it send ``HOME``,
``KVLAB_DATABASE_URL`` or the dashboard's key to a server of their choosing.  A key typed on the page goes with
that check only, wherever it is aimed; only masked forms are shown.
"""

from __future__ import annotations

import logging

import streamlit as st

from kvlab.core.urls import hide_credentials
from kvlab.dashboard.formatting import md
from kvlab.dashboard.page_keys import TYPED_HELP, key_caption, page_key
from kvlab.doctor import LABELS, Check, DoctorReport, diagnose
from kvlab.secrets import BASE_URL_VAR, DEFAULT_KEY_VAR, MODEL_ID_VAR, read_setting

#: A problem's icon: Material Symbols, which Streamlit ships (an emoji needs a font the host may lack).
ICONS = {"warn": ":material/warning:", "fail": ":material/error:"}


def check_endpoint(base_url: str, model_id: str, key_var: str, timeout_s: float,
                   typed: str = "") -> DoctorReport | None:
    try:
        choice = page_key(key_var, base_url, typed)
    except ValueError as error:  # not a key variable: nothing is sent
        st.error(md(str(error)), icon=ICONS["fail"])
        return None
    try:
        return diagnose(base_url, model_id or None, choice.key, timeout_s=timeout_s, key_source=choice.source,
                        key_var=key_var or DEFAULT_KEY_VAR, withheld=choice)
    except Exception as error:  # a bug in the doctor: a message here, the traceback in the server log
        logging.getLogger("kvlab.dashboard").exception("endpoint doctor failed")
        st.error(f"The check itself failed ({type(error).__name__}); the details are in the dashboard's log.")
        return None


def show_problem(check: Check) -> None:
    text = f"**{check.name}**: {md(check.detail)}" + (f"  \n**Fix:** {md(check.fix)}" if check.fix else "")
    (st.error if check.status == "fail" else st.warning)(text, icon=ICONS[check.status])


def show_report(report: DoctorReport) -> None:
    st.caption(f"Checked {md(report.base_url or '(no base URL)')}, model {md(report.model_id or '(none)')}, "
               f"key {md(report.key)}")
    failed = sum(check.status == "fail" for check in report.checks)
    if report.ok:
        st.success("All checks passed.", icon=":material/check_circle:")
    else:
        st.error(f"{failed} check(s) failed: the fixes are below.", icon=":material/error:")
    for check in report.problems:
        show_problem(check)
    rows = [{"Check": check.name, "Status": LABELS[check.status], "Result": check.detail, "Fix": check.fix}
            for check in report.checks]  # text, not emoji: a table cell draws with the page's font
    st.dataframe(rows, hide_index=True, width="stretch")


st.title("Endpoint doctor")
st.caption("Checks an OpenAI-compatible endpoint in order: the base URL, proxy variables, the connection and TLS, "
           "the API key, the model list and a one-token completion.")
left, right = st.columns([3, 2])
# A user:password in KVLAB_BASE_URL is shown as ***@ (the doctor reports it; kvlab never sends it).
base_url = left.text_input("Base URL", value=hide_credentials(read_setting(BASE_URL_VAR)[0] or ""),
                           key="doctor_base_url",
                           placeholder="http://127.0.0.1:8000/v1")
model_id = right.text_input("Model id", value=read_setting(MODEL_ID_VAR)[0] or "", key="doctor_model_id",
                            help="Empty: the doctor lists the models the server has.")
left, right = st.columns([3, 2])
key_var = left.text_input("Key variable", value=DEFAULT_KEY_VAR, key="doctor_key_var",
                          help="The variable, in the dashboard's environment or .streamlit/secrets.toml, that holds "
                               "the API key: a <NAME>_API_KEY, sent only to the URL in <NAME>_BASE_URL "
                               "(KVLAB_API_KEY to KVLAB_BASE_URL's).").strip()
timeout_s = right.number_input("Timeout (s)", min_value=0.1, max_value=600.0, value=10.0, step=1.0,
                               key="doctor_timeout")
typed = st.text_input("API key (optional)", type="password", key="doctor_typed_key", help=TYPED_HELP)
st.caption(key_caption(key_var, base_url.strip(), typed))

if st.button("Check endpoint", type="primary", icon=":material/stethoscope:", key="doctor_check"):
    with st.spinner("Checking the endpoint..."):
        st.session_state["doctor_report"] = check_endpoint(base_url.strip(), model_id.strip(), key_var,
                                                           float(timeout_s), typed)
if st.session_state.get("doctor_report") is not None:
    show_report(st.session_state["doctor_report"])

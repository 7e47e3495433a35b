"""Issue 47, a dashboard served to a team: no page or link sends a setting of the dashboard's process as a key, or
the dashboard's key to a host of the link's choosing (rows 1 and 10, checked at a local server that records the
``Authorization`` header it receives); a link's out-of-range numbers are one line each, the page drawn (row 12);
own text too long for a link stays out of it, and "Save as experiment" is off for it (row 7).  The inputs are the
issue's, quoted; Streamlit's AppTest runs the real app.py."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from streamlit.testing.v1 import AppTest

from kvlab.cli.main import main
from kvlab.dashboard import page_table
from kvlab.dashboard.playground import LINK_TEXT_CHARS, NUMBER_RANGES, PlaygroundView
from tests.adversarial.test_pages_no_traceback import COMPARE, TUNE, VIEW, db, open_page, texts  # noqa: F401
from tests.dashboard.test_dashboard import share_link
from tests.test_doctor import Behaviour, serve  # noqa: F401  (the recording server and its fixture)
from tests.waiting import SAFETY_S

PLAYGROUND = page_table.PLAYGROUND.script
DOCTOR = str(Path(__file__).resolve().parents[2] / page_table.DOCTOR.script)  # the page alone, as test_doctor
KEY = "sk-dashboards-own-key-0123456789"
DATABASE_URL = "postgresql://kvlab:db-password-0123@db.internal/kvlab"


@pytest.fixture(autouse=True)
def dashboard_env(monkeypatch, tmp_path):
    """The dashboard's process: its key and its database URL set, no secrets file, no proxy."""
    for var in ("KVLAB_BASE_URL", "KVLAB_MODEL_ID", "KVLAB_PLAYGROUND_URL", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KVLAB_SECRETS_FILE", str(tmp_path / "no-secrets.toml"))
    monkeypatch.setenv("KVLAB_API_KEY", KEY)
    monkeypatch.setenv("KVLAB_DATABASE_URL", f"sqlite:///{tmp_path / 'kvlab.sqlite'}")


def run(at: AppTest) -> AppTest:
    """Click Run, wait for the Run's own thread, draw the page with its answer (or its error)."""
    at.button(key="run").click().run()
    job = at.session_state["playground-run"] if "playground-run" in at.session_state else None
    assert job is None or job.wait(SAFETY_S)
    return at.run()


# -- row 1: the endpoint doctor ----------------------------------------------------------------------------------


@pytest.mark.parametrize("var", ["HOME", "KVLAB_DATABASE_URL"])
def test_row1_key_variable_home_or_the_database_url_is_never_sent(serve, monkeypatch, var):  # noqa: F811
    """'On /doctor, "Key variable" = HOME and Check: ... the endpoint receives Authorization: Bearer /root'."""
    monkeypatch.setenv("HOME", "/root")
    monkeypatch.setenv("KVLAB_DATABASE_URL", DATABASE_URL)  # the doctor's page opens no store
    recorder = Behaviour()
    at = AppTest.from_file(DOCTOR, default_timeout=SAFETY_S).run()
    at.text_input(key="doctor_base_url").input(serve(recorder) + "/v1")
    at.text_input(key="doctor_key_var").input(var).run()
    at.button(key="doctor_check").click().run()
    assert not at.exception
    assert [e.value.replace("\\", "") for e in at.error][0].startswith(f"{var} is not a key variable")
    assert recorder.authorization == []  # nothing was sent at all
    shown = texts(at.caption) + texts(at.markdown) + texts(at.error)
    assert "/root" not in shown and "db-password" not in shown and "(environment variable HOME)" not in shown


@pytest.mark.parametrize("var", ["HOME", "KVLAB_DATABASE_URL"])
def test_row1_the_cli_doctor_refuses_them_too(serve, monkeypatch, capsys, var):  # noqa: F811
    monkeypatch.setenv("KVLAB_DATABASE_URL", DATABASE_URL)
    recorder = Behaviour()
    assert main(["doctor", "--base-url", serve(recorder) + "/v1", "--api-key-env", var, "--timeout", "2"]) == 2
    captured = capsys.readouterr()
    assert f"{var} is not a key variable" in captured.err and "Traceback" not in captured.err
    assert recorder.authorization == [] and "db-password" not in captured.out + captured.err


def test_row1_the_dashboards_key_is_not_aimed_at_a_server_of_the_visitors_choosing(serve):  # noqa: F811
    recorder = Behaviour()
    at = AppTest.from_file(DOCTOR, default_timeout=SAFETY_S).run()
    at.text_input(key="doctor_base_url").input(serve(recorder) + "/v1").run()
    at.button(key="doctor_check").click().run()
    assert not at.exception and recorder.authorization and not any(KEY in sent for sent in recorder.authorization)
    said = (texts(at.caption) + texts(at.markdown)).replace("\\", "")  # no KVLAB_BASE_URL: it belongs nowhere
    assert "KVLAB_API_KEY is declared for no URL (KVLAB_BASE_URL or KVLAB_PLAYGROUND_URL)" in said


# -- row 10: the playground's share link -------------------------------------------------------------------------


def test_row10_a_share_link_does_not_send_the_dashboards_key_to_its_host(serve, monkeypatch):  # noqa: F811
    """'/playground?engine=endpoint&base_url=http://HOST/v1&model_id=m&source=text&context=x&question=q and one
    click on Run send Authorization: Bearer <key> ... to HOST, without a word'."""
    recorder = Behaviour(models=("m",))
    host = serve(recorder)
    monkeypatch.setenv("KVLAB_BASE_URL", "https://llm.team.example/v1")  # where the dashboard's key belongs
    at = open_page(PLAYGROUND, {"engine": "endpoint", "base_url": f"{host}/v1", "model_id": "m", "source": "text",
                                "context": "x", "question": "q"})
    assert not at.exception
    said = texts(at.caption).replace("\\", "")
    assert (f"Key: none sent. KVLAB_API_KEY belongs to https://llm.team.example:443 (KVLAB_BASE_URL), not to "
            f"{host}: it is not sent there") in said  # a word, before the Run
    run(at)
    assert not at.exception and recorder.authorization  # the Run reached HOST...
    assert not any(KEY in sent for sent in recorder.authorization), recorder.authorization  # ...without the key
    assert KEY not in share_link(at) and KEY not in texts(at.error) + texts(at.caption)


def test_row10_a_key_typed_on_the_page_or_the_dashboards_own_url_carries_it(serve, monkeypatch):  # noqa: F811
    recorder = Behaviour(models=("m",))
    host = serve(recorder)
    link = {"engine": "endpoint", "base_url": f"{host}/v1", "model_id": "m", "source": "text", "context": "x",
            "question": "q"}
    at = open_page(PLAYGROUND, link)
    at.text_input(key="playground-typed-key").input("sk-typed-by-the-user-0000").run()
    run(at)
    assert "Bearer sk-typed-by-the-user-0000" in recorder.authorization
    assert "sk-typed-by-the-user" not in share_link(at)  # never in the link
    recorder.authorization.clear()
    monkeypatch.setenv("KVLAB_BASE_URL", f"{host}/v1")  # the dashboard's own endpoint: its key goes there
    at = open_page(PLAYGROUND, link)
    run(at)
    assert f"Bearer {KEY}" in recorder.authorization


# -- row 12: out-of-range link values ----------------------------------------------------------------------------

ROW_12 = ["length=200000", "length=10", "seed=-5", "depth=2", "row=0", "seed=1e23"]
WIDER = ["depth=nan", "depth=inf", "depth=-0.1", "length=1e400", "length=8193", "length=63", "seed=9007199254740992",
         "seed=1.5", "row=-1", "row=1.5", "row=99999999999999999999", "max_new_tokens=0", "max_new_tokens=100000",
         "length=0x10", "seed=", "length= 512 "]


@pytest.mark.parametrize("pair", ROW_12 + WIDER)
def test_row12_an_out_of_range_number_is_one_line_and_the_page_is_drawn(pair):
    name, value = pair.split("=", 1)
    source = {"row": "file", "max_new_tokens": "text"}.get(name, "task")
    at = open_page(PLAYGROUND, {name: value, "source": source})
    assert not at.exception, texts(at.exception)
    assert "Something went wrong" not in texts(at.error), texts(at.error)
    warnings = [w.value.replace("\\", "") for w in at.warning]
    low, high = NUMBER_RANGES[name]
    if value.strip() == "512":  # in range, with blanks around it: taken
        assert warnings == [] and share_link(at).count("length=512") == 1
        return
    [line] = warnings
    assert line.startswith(f"The link's {name}={value}") and line.endswith("; left at its default"), line
    if "out of range" in line:
        assert f"out of range ({low:,}-{high:,})" in line
    assert at.button(key="run") is not None  # the page is drawn to its end


@pytest.mark.parametrize("params, said", [
    ('{"num_pairs":100000}', "task_params: num_pairs=100000 is out of range (2-1000); left at its default"),
    ('{"num_pairs":-1}', "task_params: num_pairs=-1 is out of range (2-1000); left at its default"),
    ('{"num_pairs":"lots"}', 'task_params: num_pairs="lots" is not a number; left at its default'),
    ('{"num_pairs":2.5}', "task_params: num_pairs=2.5 is not a whole number; left at its default"),
])
def test_row12_a_tasks_own_numbers_in_a_link_are_held_to_their_ranges_too(params, said):
    view, problems = PlaygroundView.from_params({"task": "multikey", "task_params": params})
    assert problems == [said] and view.task_params == ""
    at = open_page(PLAYGROUND, {"task": "multikey", "task_params": params})
    assert not at.exception and "Something went wrong" not in texts(at.error)
    assert [w.value.replace("\\", "") for w in at.warning] == [f"The link's {said}"]


def test_row12_an_unknown_task_is_said_not_silently_replaced():
    assert PlaygroundView.from_params({"task": "nosuch"})[1][0].startswith("task: 'nosuch' is not one of")


@pytest.mark.parametrize("page, params", [
    (VIEW, {"id": "0"}), (VIEW, {"id": "-5"}), (VIEW, {"id": "1e23"}), (VIEW, {"id": "1", "margin": "5"}),
    (VIEW, {"id": "1", "margin": "-1"}), (VIEW, {"id": "1", "margin": "nan"}), (VIEW, {"id": "1", "margin": "1e400"}),
    (COMPARE, {"ids": ["0", "-5", "1e23"]}), (TUNE, {"id": "0"}), (TUNE, {"id": "1e23"}),
])
def test_row12_the_other_pages_numeric_link_values_never_stop_a_page(db, page, params):  # noqa: F811
    at = open_page(page, params)
    assert not at.exception, texts(at.exception)
    assert "Something went wrong" not in texts(at.error), texts(at.error)


# -- row 7: own text in a link, and "Save as experiment" ---------------------------------------------------------


def test_row7_own_text_longer_than_a_link_carries_stays_on_the_page_not_in_the_link():
    text = "The passkey is 31337. " * 50  # ~1,100 characters, as in the issue
    at = open_page(PLAYGROUND, {"source": "text"})
    at.text_area[0].input(text).run()
    link = share_link(at)
    assert "context" not in parse_qs(urlsplit(link).query) and len(link) < 200, link
    assert f"is not in the link: a link carries your own text up to {LINK_TEXT_CHARS} characters" in \
        texts(at.sidebar.caption).replace("\\", "")
    assert at.text_area[0].value == text  # the page keeps it (this tab's session)
    at.text_input[0].input("What is the passkey?").run()  # another widget changed: the text stays
    assert at.text_area[0].value == text and "context" not in parse_qs(urlsplit(share_link(at)).query)
    short = "The passkey is 31337."
    at.text_area[0].input(short).run()
    assert parse_qs(urlsplit(share_link(at)).query)["context"] == [short]


def test_row7_save_as_experiment_is_off_for_own_text_and_says_why():
    at = open_page(PLAYGROUND, {"source": "text", "context": "x", "question": "q"})
    save = at.button(key="save")
    assert save.disabled and "Save as experiment runs a whole task" in save.help
    at = open_page(PLAYGROUND)
    assert not at.button(key="save").disabled  # a task's item: a sweep of the task
    assert json.dumps(PlaygroundView().params()) == "{}"

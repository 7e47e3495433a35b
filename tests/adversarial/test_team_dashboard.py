"""Issue 47, a dashboard served to a team: no page or link sends a setting of the dashboard's process as a key, or
the dashboard's key to a host of the link's choosing (rows 1 and 10, checked at a local server that records the
``Authorization`` header it receives); a link's out-of-range numbers are one line each, the page drawn (row 12);
own text too long for a link stays out of it, and "Save as experiment" is off for it (row 7).  The inputs are the
issue's, quoted; Streamlit's AppTest runs the real app.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from streamlit.testing.v1 import AppTest

from kvlab.cli.main import main
from kvlab.core.errors import ConfigError
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


# -- rows 1 and 10, the run a form queues: New experiment, "Save as experiment", a Tune, a Rerun --------------------

NEW = page_table.NEW.script
TEAM_URL = "https://llm.team.example/v1"  # where the dashboard's key belongs (KVLAB_BASE_URL)
BELONGS = "KVLAB_API_KEY belongs to https://llm.team.example:443 (KVLAB_BASE_URL), not to "


@pytest.fixture
def queued(monkeypatch, tmp_path):
    """The dashboard's store, and the local workers a Launch would start, recorded instead of started."""
    from kvlab.store import Store

    monkeypatch.setenv("KVLAB_BASE_URL", TEAM_URL)
    monkeypatch.setenv("KVLAB_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "data").mkdir()
    started: list[tuple] = []
    monkeypatch.setattr("kvlab.experiments.launcher.start_local_workers", lambda *args: started.append(args) or [])
    monkeypatch.setattr("kvlab.experiments.launcher.start_tune_driver", lambda *args: started.append(args))
    with Store() as store:
        yield store, started


def endpoint_spec(base_url: str, **extra):
    from kvlab.core.experiment_spec import parse_spec

    return parse_spec({"name": "aimed", "backend": {"kind": "openai_compat", "base_url": base_url, "model_id": "m"},
                       "tasks": [{"name": "passkey", "context_lengths": [256], "num_items": 1, "max_new_tokens": 4}],
                       **({"configs": [{}]} if not extra else extra)})


def test_gap_the_new_experiment_form_does_not_queue_the_dashboards_key_for_a_host_of_its_choosing(
        serve, queued):  # noqa: F811
    """'a spec with a foreign base_url and api_key_env = "KVLAB_API_KEY" still gets the worker's key sent to a host
    of the page user's choosing': the form says so before Launch, and Launch refuses in one line, nothing stored."""
    store, started = queued
    recorder = Behaviour(models=("m",))
    host = serve(recorder)
    at = open_page(NEW)
    at.selectbox(key="f:backend.kind").set_value("openai_compat").run()
    at.text_input(key="f:backend.base_url").set_value(f"{host}/v1").run()
    at.text_input(key="f:backend.model_id").set_value("m").run()
    assert not at.exception
    said = texts(at.caption).replace("\\", "")
    assert f"Key: Launch refuses this run. backend.base_url: {BELONGS}{host}: it is not sent there" in said, said
    at.button(key="launch").click().run()
    assert not at.exception and "Something went wrong" not in texts(at.error)
    [refusal] = [e.value.replace("\\", "") for e in at.error]
    assert refusal.startswith(f"backend.base_url: {BELONGS}{host}") and "\n" not in refusal, refusal
    assert KEY not in texts(at.error) + texts(at.caption)
    assert store.list_experiments() == [] and started == [] and recorder.seen == []
    at.text_input(key="f:backend.base_url").set_value("https://llm.team.example:443/v1").run()  # its own URL
    assert "sent to this URL, the one it belongs to" in texts(at.caption).replace("\\", "")
    at.button(key="launch").click().run()
    assert [e.name for e in store.list_experiments()] and started == [(1,)]


def test_gap_save_as_experiment_from_a_playground_link_on_an_endpoint_is_refused_at_launch(
        serve, queued):  # noqa: F811
    """'"Save as experiment" from the playground on an endpoint': the link's base URL reaches the form, not the
    dashboard's key."""
    store, started = queued
    recorder = Behaviour(models=("m",))
    host = serve(recorder)
    at = open_page(PLAYGROUND, {"engine": "endpoint", "base_url": f"{host}/v1", "model_id": "m"})
    at.button(key="save").click().run()  # st.switch_page to the form, which takes the playground's spec
    assert not at.exception
    at.switch_page(NEW).run()  # AppTest's next run would go back to the page it was opened on
    assert at.text_input(key="f:backend.base_url").value == f"{host}/v1"  # the form holds the link's endpoint
    at.button(key="launch").click().run()
    [refusal] = [e.value.replace("\\", "") for e in at.error]
    assert refusal.startswith(f"backend.base_url: {BELONGS}{host}"), refusal
    assert store.list_experiments() == [] and started == [] and recorder.seen == []


def test_gap_a_tune_and_a_rerun_from_the_dashboard_are_held_to_the_same_rule(queued):
    """'a Tune launched from the form, and a Rerun button of an existing experiment': the functions the pages call.
    A tune never reaches an endpoint (it searches the KV caches kvlab chooses; launch_tune submits with the same
    page limits all the same)."""
    from kvlab.dashboard.launch import rerun_from_page
    from kvlab.experiments.submit import LocalWorkers, submit

    store, started = queued
    with pytest.raises(ConfigError, match="there is nothing kvlab can tune through it"):
        endpoint_spec("http://attacker.example:8080/v1", tune={"max_trials": 2})
    first = submit(endpoint_spec("http://attacker.example:8080/v1"), LocalWorkers(0)).experiment_id  # the CLI's
    with pytest.raises(ConfigError, match="^" + re.escape(f"backend.base_url: {BELONGS}http://attacker.example:8080")):
        rerun_from_page(first, 1)
    assert [e.id for e in store.list_experiments()] == [first] and started == []


def spec_file(tmp_path: Path, base_url: str, key_var: str = "KVLAB_API_KEY") -> str:
    path = tmp_path / "aimed.toml"
    path.write_text(f'name = "aimed"\nmodel = "smollm2-135m"\n[backend]\nkind = "openai_compat"\nbase_url = '
                    f'"{base_url}"\nmodel_id = "m"\napi_key_env = "{key_var}"\n[[tasks]]\nname = "passkey"\n'
                    'context_lengths = [256]\nnum_items = 1\nmax_new_tokens = 4\n[[configs]]\nname = "baseline"\n')
    return str(path)


@pytest.mark.model
def test_gap_kvlab_run_of_the_same_spec_sends_the_key_where_its_spec_says(serve, queued, tmp_path):  # noqa: F811
    """The CLI user owns the command line (docs/decisions.md): `kvlab run` of that spec still runs against the
    spec's endpoint, with the key its spec names."""
    recorder = Behaviour(models=("m",))
    host = serve(recorder)
    assert main(["run", spec_file(tmp_path, f"{host}/v1"), "--quiet"]) == 0
    assert f"Bearer {KEY}" in recorder.authorization


@pytest.mark.parametrize("var", ["HOME", "KVLAB_DATABASE_URL"])
def test_gap_api_key_env_home_is_refused_at_validation_by_kvlab_run(serve, queued, tmp_path, capsys, var):  # noqa: F811
    """'Also refuse a non-key api_key_env (HOME, KVLAB_DATABASE_URL) at spec validation for every front end'."""
    store, started = queued
    recorder = Behaviour(models=("m",))
    assert main(["run", spec_file(tmp_path, f"{serve(recorder)}/v1", var)]) == 2
    err = capsys.readouterr().err
    assert f"backend.api_key_env: {var} is not a key variable" in err and "Traceback" not in err
    assert recorder.seen == [] and store.list_experiments() == []

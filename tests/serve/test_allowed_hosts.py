"""The Host names a ``kvlab serve`` without a key answers (DNS rebinding), without a model."""

from __future__ import annotations

import socket

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from kvlab.serve.middleware import AllowHosts, host_name
from kvlab.serve.server import LOOPBACK_NAMES, names_of


@pytest.mark.parametrize("header, name", [("127.0.0.1:8000", "127.0.0.1"), ("LocalHost", "localhost"),
                                          ("[::1]:8000", "::1"), ("::1", "::1"), ("evil.example:80", "evil.example"),
                                          ("", "")])
def test_the_name_in_a_host_header(header, name):
    assert host_name(header) == name


def test_the_names_of_an_address():
    assert names_of("127.0.0.1") == LOOPBACK_NAMES
    wildcard = names_of("0.0.0.0")
    assert LOOPBACK_NAMES <= wildcard and socket.gethostname().lower() in wildcard and "0.0.0.0" not in wildcard
    assert "10.1.2.3" in names_of("10.1.2.3")


def test_only_the_allowed_names_get_through():
    app = AllowHosts(Starlette(routes=[Route("/", lambda request: PlainTextResponse("ok"))]), {"localhost"})
    with TestClient(app, base_url="http://localhost") as client:
        assert client.get("/").text == "ok"
        refused = client.get("/", headers={"Host": "attacker.example"})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "host_not_allowed"

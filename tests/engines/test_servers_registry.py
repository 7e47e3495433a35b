"""Each serving engine is one module of kvlab/engines/servers behind one interface, and nothing else names it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kvlab
from kvlab.core.backends import BACKENDS, server_kinds
from kvlab.core.formats import FORMATS
from kvlab.engines.servers import SERVERS, serving_engine
from kvlab.engines.servers.base import ServingEngine

ROOT = Path(kvlab.__file__).resolve().parent
#: Where an engine's kind may be spelled out: its own module, and the backend registry that names it.
ALLOWED = (ROOT / "engines" / "servers", ROOT / "core" / "backends.py")


def test_one_module_per_server_backend():
    assert tuple(SERVERS) == server_kinds()
    scripts = {Path(arg).stem for server in SERVERS.values() for arg in server.entry() if arg.endswith(".py")}
    # the interface: base (ServingEngine) and installs (the host and install types its rules read)
    modules = {p.stem for p in (ROOT / "engines" / "servers").glob("*.py")} - {"__init__", "base", "installs"} - scripts
    assert modules & set(SERVERS) == set(SERVERS)
    # any other module is one engine's own (vllm_menu: what a vLLM install's sources declare)
    assert all(module.split("_")[0] in SERVERS for module in modules - set(SERVERS)), modules
    for kind, server in SERVERS.items():
        assert isinstance(server, ServingEngine) and server.kind == kind
        assert type(server).__module__ == f"kvlab.engines.servers.{kind}"
        assert server.title == BACKENDS[kind].title and set(server.kv_dtypes) <= set(FORMATS)
        assert server.health_path.startswith("/") and server.module and server.own_flags
        # every format it lacks has its note (what it offers instead, or whose format it is), and only those
        assert set(server.format_notes) <= set(FORMATS) - set(server.kv_dtypes)
        assert all(server.format_note(name) != "it has no such KV cache format"
                   for name in set(FORMATS) - set(server.kv_dtypes)), kind


def test_an_unknown_kind_is_one_line_naming_the_known_ones():
    with pytest.raises(ValueError, match="kvlab launches vllm, sglang, llamacpp servers"):
        serving_engine("tgi")


def _spelled_kinds(path: Path) -> list[tuple[int, str]]:
    """(line, kind) of every string constant in ``path`` that is exactly a server kind."""
    tree = ast.parse(path.read_text(), str(path))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in server_kinds()]


def test_no_module_outside_the_servers_and_the_registry_names_an_engine():
    """Adding an engine is its module and its registry entry: no other module branches on its kind."""
    sources = [*ROOT.rglob("*.py"), *(ROOT.parent / "pages").glob("*.py"), ROOT.parent / "app.py"]
    found = {f"{path.relative_to(ROOT.parent)}:{line}": kind for path in sources
             if not any(path.is_relative_to(allowed) for allowed in ALLOWED)
             for line, kind in _spelled_kinds(path)}
    assert not found, f"an engine's kind spelled outside its module: {found}"
    assert _spelled_kinds(ROOT / "engines" / "servers" / "vllm.py")  # the check reads real constants


def test_each_engine_declares_its_flag_for_each_setting_it_takes_and_refuses_the_others():
    """The engine settings are kvlab's; each engine names its own flag for those it takes, and a set one it does
    not take is refused with its reason -- also after the options went through JSON (set = not the default)."""
    from kvlab.core.errors import ConfigError
    from kvlab.core.experiment_spec import ServerOptions

    values = {"memory_fraction": 0.5, "kv_cache_gib": 2.0, "max_model_len": 4096, "prefix_cache": False,
              "enforce_eager": True}
    assert set(values) == set(ServerOptions.ENGINE_SETTINGS)
    assert ServerOptions.model_validate_json(ServerOptions().model_dump_json()).engine_settings_set() == []
    for kind, server in SERVERS.items():
        assert set(server.setting_flags) <= set(ServerOptions.ENGINE_SETTINGS), kind
        assert set(server.lacks) == set(ServerOptions.ENGINE_SETTINGS) - set(server.setting_flags), kind
        for name, value in values.items():
            options = ServerOptions.model_validate_json(ServerOptions(**{name: value}).model_dump_json())
            assert options.engine_settings_set() == [name]
            if name in server.setting_flags:
                server.check_options(options)
            else:
                with pytest.raises(ConfigError) as refused:
                    server.check_options(options)
                assert str(refused.value) == f"server.{name} = {str(value).lower()}: {server.lacks[name]}"


def test_a_spec_on_an_unknown_backend_is_refused_naming_the_registrys():
    from kvlab.core.errors import ConfigError
    from kvlab.core.experiment_spec import parse_spec

    with pytest.raises(ConfigError, match="backend.kind: 'tgi' is not a backend; one of embedded, .*llamacpp "
                                          "\\(`kvlab engines` lists them\\)"):
        parse_spec({"name": "x", "tasks": [{"name": "passkey"}], "backend": {"kind": "tgi"}})


def test_a_server_backend_whose_engine_cannot_be_imported_is_one_line():
    from kvlab.core.errors import ConfigError
    from kvlab.engines.servers import _load

    with pytest.raises(ConfigError, match="^backend 'x': its engine kvlab_no_such:ENGINE cannot be imported "
                                          "\\(No module named 'kvlab_no_such'\\)$"):
        _load("x", "kvlab_no_such:ENGINE")
    with pytest.raises(ConfigError, match="^backend 'vllm': kvlab.engines.servers.sglang:SGLANG is not its "):
        _load("vllm", "kvlab.engines.servers.sglang:SGLANG")

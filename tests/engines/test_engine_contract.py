"""The engine contract: every engine provides all of :class:`kvlab.engines.base.Engine`, nothing
in kvlab asks an engine for an attribute with ``getattr``, and every engine's KV bytes are one
:class:`kvlab.core.results.KVMeasurement`.

(tests/fake_engines holds stand-in *servers* for vLLM and SGLang, not engines: kvlab drives them
through :class:`LaunchedServerEngine`, which is checked here.)
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, get_args

import pytest

import kvlab
from kvlab.core.experiment_spec import parse_spec
from kvlab.core.items import TaskItem
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.results import MEASURED_SERVED, NOT_REPORTED, ItemResult, KVMeasurement
from kvlab.engines.base import Engine, Phase, passes
from kvlab.engines.embedded import EmbeddedEngine
from kvlab.engines.launched import LaunchedServerEngine
from kvlab.engines.openai_compat import LaunchedKV, OpenAICompatEngine
from kvlab.secrets import Endpoint

ENGINES = [EmbeddedEngine, OpenAICompatEngine, LaunchedServerEngine]
METHODS = ["check_configs", "check_items", "evaluate", "evaluate_many", "describe", "close", "current_kv_bytes",
           "telemetry_sources"]
#: On the class; ``name`` too, except for LaunchedServerEngine, whose name is its backend's (checked on instances).
ATTRIBUTES = ["one_config_per_pass", "launches_servers", "phase", "current_config", "tokenizer"]
#: ``getattr(engine, ...)``, ``getattr(self.engine, ...)``, ``getattr(self._inner, ...)``: asking an engine
#: what it may have.  (``getattr(engine.model.config, ...)`` reads a model's config, not an engine.)
ENGINE_GETATTR = re.compile(r"getattr\(\s*(self\.)?_?(engine|inner)\s*,")


@pytest.mark.parametrize("engine_class", ENGINES, ids=lambda c: c.__name__)
def test_every_engine_provides_the_whole_contract(engine_class):
    assert issubclass(engine_class, Engine)
    assert engine_class is LaunchedServerEngine or isinstance(engine_class.name, str)
    assert not engine_class.__abstractmethods__  # tokenizer and evaluate are its own
    for name in METHODS:
        method = getattr(engine_class, name)
        declared = inspect.signature(getattr(Engine, name))
        assert list(inspect.signature(method).parameters) == list(declared.parameters), name
    for name in ATTRIBUTES:
        assert name in dir(engine_class), name


def _work_item(item_id: str = "a") -> TaskItem:
    return TaskItem(task="passkey", item_id=item_id, kind="generate", context="ctx ", question="q?", answer="42",
                    context_length=8, depth=None, max_new_tokens=2)


class _Minimal(Engine):
    """The least an engine must write: its name, its tokenizer and ``evaluate``."""

    name = "minimal"

    @property
    def tokenizer(self) -> Any:
        return None

    def evaluate(self, item: TaskItem, configs: Sequence[KVCacheConfig]) -> Iterator[ItemResult]:
        for config in configs:
            yield ItemResult(item_id=item.item_id, task=item.task, config_name=config.label, config={}, seed=0,
                             context_length=0, depth=None, prompt_tokens=0, generated="", answer="",
                             output_tokens=0, ttft_s=0.0, tpot_s=None, prefill_s=0.0, compress_s=0.0, decode_s=0.0,
                             peak_memory_bytes=None, **KVMeasurement(context_tokens=0).result_fields())


def test_the_defaults_make_a_minimal_engine_complete():
    engine = _Minimal()
    assert (engine.phase, engine.current_config, engine.launches_servers, engine.one_config_per_pass) == \
        ("idle", None, False, False)
    assert engine.current_kv_bytes() is None and engine.telemetry_sources() == [] and engine.describe() == \
        {"engine": "minimal"}
    configs = [KVCacheConfig(), KVCacheConfig(quant="int8")]
    done = [(item.item_id, r.config_name) for item, r in engine.evaluate_many([(_work_item("a"), configs),
                                                                                (_work_item("b"), configs[:1])])]
    assert done == [("a", configs[0].label), ("a", configs[1].label), ("b", configs[0].label)]
    assert passes(engine, configs) == [configs]
    engine.check_configs(configs), engine.check_items([_work_item()]), engine.close()

    class _NoEvaluate(Engine):
        name = "broken"
        tokenizer = None

    with pytest.raises(TypeError, match="evaluate"):
        _NoEvaluate()


def test_served_engines_start_idle_and_declare_what_they_launch():
    endpoint = Endpoint(base_url="http://127.0.0.1:9/v1", model_id="m", api_key=None, key_source="not set")
    spec = parse_spec({"name": "c", "model": "smollm2-135m", "tasks": [{"name": "passkey"}],
                       "configs": [{"name": "baseline"}],
                       "backend": {"kind": "vllm"}})
    remote = OpenAICompatEngine(endpoint, spec.backend, tokenizer=None)
    launched = LaunchedServerEngine(spec, tokenizer=None, tokenizer_note="")
    try:
        for engine in (remote, launched):
            assert engine.phase in get_args(Phase) and engine.phase == "idle" and engine.current_config is None
            assert engine.current_kv_bytes() is None
        assert (remote.name, launched.name) == ("openai_compat", "vllm")
        assert (remote.launches_servers, launched.launches_servers) == (False, True)
        assert (remote.one_config_per_pass, launched.one_config_per_pass) == (False, True)
        assert [source.name for source in launched.telemetry_sources()] == ["server"]
        assert launched.telemetry_sources()[0].read() == {}  # no server up yet: nothing to record
    finally:
        remote.close(), launched.close()


@pytest.mark.model
def test_the_embedded_engine_is_idle_between_items(engine):
    from kvlab.core.kv_config import KVCacheConfig
    from kvlab.core.tasks import TaskSpec
    from kvlab.tasks import generate_items

    item = generate_items(TaskSpec(name="passkey", context_lengths=[256], depths=[0.5], num_items=1),
                          engine.tokenizer, seed=0)[0]
    assert len(list(engine.evaluate(item, [KVCacheConfig(), KVCacheConfig(quant="int4")]))) == 2
    assert (engine.phase, engine.current_config, engine.current_kv_bytes()) == ("idle", None, None)
    assert engine.telemetry_sources() == [] and engine.max_context == 8192


def test_no_module_reads_an_engine_attribute_with_getattr():
    root = Path(kvlab.__file__).parent
    hits = [f"{path.relative_to(root.parent)}:{number}: {line.strip()}"
            for path in sorted(root.rglob("*.py"))
            for number, line in enumerate(path.read_text().splitlines(), 1) if ENGINE_GETATTR.search(line)]
    assert hits == []
    assert ENGINE_GETATTR.search('getattr(engine, "phase", None)')  # the pattern finds what it is for
    assert ENGINE_GETATTR.search("getattr(self._inner, 'x')")


# -- one KVMeasurement ------------------------------------------------------------------------------


def test_a_measurement_round_trips_through_its_dict_and_an_item_result():
    kv = KVMeasurement(context_tokens=300, kept_tokens=150.0, kept_fraction=0.5, baseline_bytes=4000,
                       physical_bytes=1000, analytic_bytes=990, peak_bytes=1100, source=MEASURED_SERVED)
    assert kv.compression_ratio == 4.0
    assert KVMeasurement.from_dict(kv.to_dict()) == kv
    result = _Minimal().evaluate(_work_item(), [KVCacheConfig()]).__next__()
    row = ItemResult(**(result.to_dict() | kv.result_fields()))
    assert row.kv == kv and (row.baseline_kv_bytes, row.compression_ratio, row.extra) == \
        (4000, 4.0, {"kv_bytes_source": MEASURED_SERVED})


def test_an_older_server_block_and_unknown_bytes_read_as_such():
    old_block = {"config": "baseline", "settings": {}, "context_tokens": 10, "kept_tokens": 10.0,
                 "kept_fraction": 1.0, "baseline_bytes": 64, "physical_bytes": 0, "analytic_bytes": 0,
                 "peak_bytes": 8, "prefill_s": 0.1, "compress_s": 0.0}  # before `estimated` and `source`
    kv = KVMeasurement.from_dict(old_block, default_source=MEASURED_SERVED)
    assert (kv.source, kv.estimated, kv.compression_ratio) == (MEASURED_SERVED, False, math.inf)
    unknown = KVMeasurement(context_tokens=7)
    assert unknown.compression_ratio is None and unknown.source == NOT_REPORTED
    assert unknown.result_fields()["kv_bytes_estimated"] is False
    with pytest.raises(ValueError, match="not a KV-cache measurement"):
        KVMeasurement.from_dict({"physical_bytes": 5})


def test_a_launched_server_gives_an_estimate_naming_its_log_line():
    pool = LaunchedKV(config=KVCacheConfig(quant="fp8_e4m3"), bytes_per_token=100.0, baseline_bytes_per_token=200.0,
                      source="vllm start-up log: GPU KV cache size: 100,000 tokens")
    kv = pool.measure(prompt_tokens=10, output_tokens=5)
    assert (kv.physical_bytes, kv.baseline_bytes, kv.peak_bytes, kv.analytic_bytes) == (1000, 2000, 1500, None)
    assert kv.estimated and kv.compression_ratio == 2.0 and kv.source.endswith("GPU KV cache size: 100,000 tokens")
    no_pool = LaunchedKV(config=KVCacheConfig(), bytes_per_token=None, baseline_bytes_per_token=None, source="-")
    assert no_pool.measure(10, 5) == KVMeasurement(context_tokens=10)

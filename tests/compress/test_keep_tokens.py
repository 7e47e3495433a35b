"""``keep_tokens``: an absolute budget, a fourth kind in the budget registry (issue 23; kvpress #102 asks
for it, #264/#277 report fractions that round a layer to zero).  A count per head and layer, the
sinks, the observation window and a query-aware question among it, never no context token."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.methods import BUDGETS, FRACTION_COUNT_BUDGETS, METHODS
from kvlab.core.tasks import TaskSpec
from kvlab.tasks import generate_items


def test_keep_tokens_is_a_registered_count_budget():
    kind = BUDGETS["keep_tokens"]
    assert kind.integer and kind.fixes_count and "keep_tokens" not in FRACTION_COUNT_BUDGETS
    assert KVCacheConfig(evict="snapkv", keep_tokens=512).label == "snapkv:n512"
    for bad in (0, -3, 2.5):
        with pytest.raises(ValidationError):
            KVCacheConfig(evict="snapkv", keep_tokens=bad)
    # budget-dependent scorers read a fraction of the context: a count is refused with their budgets
    for name in ("compactor", "criticalkv"):
        assert METHODS[name].budget_dependent
        with pytest.raises(ValidationError, match="its budgets: ratio, keep_fraction"):
            KVCacheConfig(evict=name, keep_tokens=64)
    with pytest.raises(ValidationError, match="needs exactly one budget"):
        KVCacheConfig(evict="snapkv", keep_tokens=64, ratio=0.5)


def test_the_cli_the_tune_and_the_form_take_a_count():
    from kvlab.cli.main import build_parser
    from kvlab.cli.serve import kv_config_from_args
    from kvlab.core.tune_spec import TuneSpec
    from kvlab.dashboard.spec_form import config_row
    from kvlab.tune.recommend import serve_command

    for config in (KVCacheConfig(evict="snapkv", keep_tokens=256, query_aware=True),
                   KVCacheConfig(evict="knorm", keep_tokens=1_034_567, query_aware=True,
                                 decode={"interval": 1_048_000, "target_tokens": 1_000_001})):
        argv = serve_command("smollm2-135m", config).split()[1:]
        assert "--keep-tokens" in argv and kv_config_from_args(build_parser().parse_args(argv)) == config
    assert KVCacheConfig(evict="knorm", keep_tokens=1_034_567).label == "knorm:n1034567"  # never 1.03457e+06
    for bad in ("0", "2.5"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--keep-tokens", bad])
    with pytest.raises(ValidationError):  # a tune searches fractions of the context
        TuneSpec(evict=["snapkv"], budget="keep_tokens")
    assert config_row({"evict": "snapkv", "keep_tokens": 256.0}) == {"evict": "snapkv", "keep_tokens": 256}


@pytest.mark.model
def test_each_layer_keeps_exactly_the_count_and_its_bytes_fall_with_it(engine):
    item = generate_items(TaskSpec(name="passkey", context_lengths=[1024], num_items=1), engine.tokenizer, seed=0)[0]
    configs = [KVCacheConfig(evict="snapkv", keep_tokens=200), KVCacheConfig(evict="streaming_llm", keep_tokens=100),
               KVCacheConfig(evict="pyramidkv", keep_tokens=256), KVCacheConfig(evict="knorm", keep_tokens=5000),
               KVCacheConfig(evict="snapkv", keep_tokens=120, query_aware=True),
               KVCacheConfig(evict="knorm", keep_tokens=1, query_aware=True)]
    results = {r.config_name: r for r in engine.evaluate(item, configs)}
    per_token = engine.geometry.baseline_bytes(1)
    for name, kept in (("snapkv:n200", 200), ("streaming_llm:n100", 100), ("pyramidkv:n256", 256)):
        assert results[name].kept_tokens == kept  # pyramidkv: the mean over layers, its schedule around it
    for name in ("snapkv:n200", "streaming_llm:n100"):  # every layer the same count: bytes by hand
        assert results[name].physical_kv_bytes == results[name].kept_tokens * per_token
    assert results["knorm:n5000"].kept_tokens == results["knorm:n5000"].context_tokens  # more than there is
    # query-aware: the question's tokens are among the count, and a layer always keeps a context token
    question = results["snapkv:n120/qa"].context_tokens - results["knorm:n5000"].context_tokens
    assert results["snapkv:n120/qa"].kept_tokens == 120
    assert results["knorm:n1/qa"].kept_tokens == question + 1

"""Cross-engine agreement (kvlab.analysis.agreement): pairs, the stop sequence, bytes per context token."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvlab.analysis.agreement import answer_text, different_items, engine_agreement, engines_table
from kvlab.core.results import TEACHER_BASELINE_OUTPUT, TEACHER_BASELINE_SAMPLE, Fidelity
from tests.dashboard_data import item_result

STOP = {"stop": [".", "\n"]}


def embedded(config: str, item: int):
    """As the embedded engine stores it: the stop sequence it stopped at is in the text."""
    return replace(item_result(config, item, 512, 0.5), extra=dict(STOP))


def served(config: str, item: int, bytes_per_token: float):
    """As a server answers: the text ends before the stop sequence; bytes are the pool's estimate."""
    result = embedded(config, item)
    return replace(result, generated=result.generated.rstrip("."), kv_bytes_estimated=True,
                   context_tokens=result.prompt_tokens, physical_kv_bytes=round(bytes_per_token * result.prompt_tokens))


def test_the_answer_text_is_cut_at_the_first_stop_sequence():
    assert answer_text(replace(embedded("baseline", 0), generated=" 12345.\nmore")) == "12345"
    assert answer_text(replace(embedded("baseline", 0), extra={})) == "12345."  # no stop recorded: as generated


def test_two_engines_config_by_config():
    a = [embedded(config, item) for config in ("baseline", "int2") for item in range(4)]
    b = [served("baseline", item, 23_046) for item in range(4)]
    b += [replace(served("int2", item, 11_523), generated=" 12345", score=1.0) for item in range(3)]  # 3 of 4 items
    rows = {row.config_name: row for row in engine_agreement(a, b)}
    assert list(rows) == ["baseline", "int2"]
    base, int2 = rows["baseline"], rows["int2"]
    assert (base.items, base.same_outcome, base.same_text) == (4, 1.0, 1.0)  # "12345." and "12345" are one answer
    assert base.kv_bytes_a == pytest.approx(a[0].physical_kv_bytes / a[0].context_tokens)  # per context token
    assert base.kv_bytes_b == pytest.approx(23_046)
    assert (base.estimated_a, base.estimated_b) == (False, True)
    # int2 gets items 0 and 1 wrong on the embedded engine (PROFILE), all of them right here
    assert int2.items == 3 and int2.accuracy_a == pytest.approx(1 / 3) and int2.accuracy_b == 1.0
    assert int2.same_outcome == pytest.approx(1 / 3) and int2.same_text == pytest.approx(1 / 3)


def test_results_with_an_error_or_only_on_one_side_are_left_out():
    a = [embedded("baseline", 0), replace(embedded("int4", 0), error="boom")]
    b = [served("baseline", 1, 23_046), served("int4", 0, 11_523)]
    assert engine_agreement(a, b) == []


def test_each_engine_shows_its_configs_fidelity_to_its_own_baseline_and_its_estimator():
    def with_kl(result, kls, teacher):
        fid = Fidelity(kl=tuple(kls), agree=tuple(k < 0.5 for k in kls), teacher=teacher)
        return replace(result, extra=result.extra | {"fidelity": fid.to_dict()})

    a = [embedded("baseline", item) for item in range(3)]
    a += [with_kl(embedded("int4", item), [0.1 * (item + 1), 0.0], TEACHER_BASELINE_OUTPUT) for item in range(3)]
    b = [served("baseline", item, 23_046) for item in range(3)]
    b += [with_kl(served("int4", item, 11_523), [0.2, -0.1 + item], TEACHER_BASELINE_SAMPLE) for item in range(3)]
    rows = {row.config_name: row for row in engine_agreement(a, b)}
    assert rows["baseline"].fidelity_a is None and rows["baseline"].fidelity_b is None
    int4_a, int4_b = rows["int4"].fidelity_a, rows["int4"].fidelity_b
    assert int4_a is not None and int4_b is not None
    assert int4_a.mean_kl == pytest.approx(0.1) and int4_a.items == 3 and int4_a.teacher == TEACHER_BASELINE_OUTPUT
    assert int4_b.mean_kl == pytest.approx((0.05 + 0.55 + 1.05) / 3) and int4_b.teacher == TEACHER_BASELINE_SAMPLE
    assert int4_a.kl_low <= int4_a.mean_kl <= int4_a.kl_high and int4_a.text.startswith("0.1 [")


def test_engines_side_by_side_on_the_items_all_of_them_ran_whatever_their_configs():
    """Three engines with formats of their own: every config of each, against its own baseline, on the shared items."""
    embedded_run = [embedded(config, item) for config in ("baseline", "int2") for item in range(4)]
    def own(name: str, item: int, per_token: float):  # a config of the engine's own format, answered as the baseline
        return replace(served("baseline", item, per_token), config_name=name)

    llama = [own(config, item, per_token) for config, per_token in (("baseline", 23_040), ("q8_0", 12_240))
             for item in range(4)]
    vllm = [own(config, item, per_token) for config, per_token in (("baseline", 23_046), ("fp8_e4m3", 11_523))
            for item in range(3)]  # one item fewer: the table keeps the 3 all of them ran
    vllm.append(replace(own("fp8_e4m3", 3, 11_523), error="boom"))
    rows = engines_table([(1, "embedded", embedded_run), (2, "llamacpp", llama), (3, "vllm", vllm)])
    assert [(r.experiment_id, r.engine, r.config_name) for r in rows] == [
        (1, "embedded", "baseline"), (1, "embedded", "int2"), (2, "llamacpp", "baseline"), (2, "llamacpp", "q8_0"),
        (3, "vllm", "baseline"), (3, "vllm", "fp8_e4m3")]
    assert {r.items for r in rows} == {3}
    q8 = rows[3]
    assert q8.kv_bytes == pytest.approx(12_240) and q8.estimated and q8.accuracy == 1.0
    assert not rows[1].estimated and rows[1].accuracy == pytest.approx(1 / 3)  # int2 misses items 0 and 1: PROFILE
    assert engines_table([(1, "embedded", embedded_run), (2, "llamacpp", [served("baseline", 9, 1.0)])]) == []


def test_items_pair_by_their_content_not_their_id_alone():
    """The same id under another seed is another item (issue 47 row 3): its stored content hash differs; a
    result stored without one (before kvlab kept it) is known by its seed and expected answer."""
    a = [replace(embedded("baseline", 0), extra=STOP | {"item_hash": "aaaa"})]
    assert engine_agreement(a, [replace(a[0], extra=STOP | {"item_hash": "bbbb"})]) == []
    assert [row.items for row in engine_agreement(a, [replace(a[0])])] == [1]
    legacy = embedded("baseline", 0)
    assert engine_agreement([legacy], [replace(legacy, seed=1)]) == []
    assert engine_agreement([legacy], [replace(legacy, answer="54321")]) == []
    assert [row.items for row in engine_agreement([legacy], [replace(legacy)])] == [1]
    assert engines_table([(1, "embedded", a), (2, "vllm", [replace(a[0], extra=STOP | {"item_hash": "bbbb"})])]) == []
    note = different_items([(1, a), (2, [replace(a[0], seed=1, answer="86717", extra={"item_hash": "bbbb"})])])
    assert note == ("1 item id(s) name different items in these experiments and are not paired (their prompts and "
                    "answers differ: another seed, say, generates other items under the same ids), e.g. "
                    "passkey/passkey-512-0: #1 (seed 0) expects '12345'; #2 (seed 1) expects '86717'")
    assert different_items([(1, a), (2, a)]) is None

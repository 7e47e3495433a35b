"""End to end on the real model: the runner, the CLI, JSON output and summaries."""

from __future__ import annotations

import json
import sys

import pytest

from kvlab.analysis.summary import decide, pareto_front, summarize
from kvlab.cli.main import main
from kvlab.core.experiment_spec import parse_spec
from kvlab.core.margins import Margins
from kvlab.experiments.runner import run_experiment

pytestmark = pytest.mark.model

SPEC = {
    "name": "e2e", "seed": 5,
    "tasks": [{"name": "passkey", "context_lengths": [384], "depths": [0.5], "num_items": 2, "max_new_tokens": 7}],
    "configs": [{"name": "int4", "quant": "int4"}, {"name": "streaming-90", "evict": "streaming_llm", "ratio": 0.9}],
}


def test_sweep_end_to_end_is_deterministic(engine):
    spec = parse_spec(SPEC)
    first = run_experiment(spec, engine=engine)
    second = run_experiment(spec, engine=engine)
    assert [c.label for c in first.configs] == ["baseline", "int4", "streaming-90"]
    assert len(first.results) == 2 * 3
    assert [(r.score, r.generated, r.physical_kv_bytes) for r in first.results] == \
        [(r.score, r.generated, r.physical_kv_bytes) for r in second.results]
    assert any("no baseline config" in w for w in first.warnings)
    summaries = {s.config_name: s for s in first.summaries()}
    assert summaries["baseline"].accuracy == 1.0 and summaries["baseline"].compression_ratio == pytest.approx(1.0)
    assert summaries["streaming-90"].kept_fraction == pytest.approx(0.1, abs=0.02)
    # streaming keeps 10%: the mid-context needle is gone
    assert summaries["streaming-90"].accuracy == 0.0
    assert summaries["streaming-90"].test == "mcnemar-exact"
    assert summaries["int4"].compression_ratio > 1.5  # 384 tokens: up to 127 of them in the 16-bit residual
    front = [s.config_name for s in pareto_front(first.summaries())]
    assert "streaming-90" in front
    # By accuracy alone, 2 items cannot show anything non-inferior within 0.05.  A baseline right on
    # every item, 2 configs compared: z(0.025 / 2) = 2.2414, n >= 19 z^2 = 95.5 -> 96 items for a config as accurate.
    accuracy_alone = decide(summarize(first.results, "baseline", Margins(max_kl=0)))
    assert accuracy_alone.sweet_spot is None and accuracy_alone.items_needed == 96
    assert "Holm" in accuracy_alone.rule and "about 96 items" in accuracy_alone.note
    # Fidelity, on the same 2 items, certifies int4 (its distributions follow the baseline's token by
    # token) and rejects streaming-90 (its tokens leave the baseline's at once)
    decided = first.to_dict()["sweet_spot"]
    assert decided["config"] == "int4" and decided["max_drop"] == 0.05 and decided["max_kl"] == 0.05
    assert decided["decided_by"] == {"passkey": "fidelity"} and "mean KL below 0.05" in decided["rule"]
    assert summaries["int4"].mean_kl < 0.05 < summaries["streaming-90"].mean_kl
    assert summaries["streaming-90"].non_inferior is False
    assert summaries["streaming-90"].stopped_by.task == "passkey"
    assert {"diff_vs_baseline", "non_inferior", "p_adjusted", "fidelity", "task_verdicts"} <= \
        first.to_dict()["summary"][1].keys()
    exported = first.to_dict()["results"]
    for baseline, row in ((exported[0], exported[1]), (exported[0], exported[2])):  # every per-token figure
        assert (len(row["extra"]["fidelity"]["kl"]) == len(row["extra"]["fidelity"]["agree"])
                == baseline["output_tokens"])


@pytest.mark.parametrize("stored", [True, False])
def test_cli_run_prints_table_and_writes_json(tmp_path, capsys, engine, monkeypatch, stored):
    import tomli_w

    from kvlab.store import Store

    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(tomli_w.dumps(SPEC))
    database = f"sqlite:///{tmp_path / 'kvlab.sqlite'}"
    monkeypatch.setenv("KVLAB_DATABASE_URL", database)
    monkeypatch.setattr("kvlab.experiments.submit.build_engine" if stored else "kvlab.experiments.runner.build_engine",
                        lambda spec: engine)
    out = tmp_path / "run.json"
    assert main(["run", str(spec_path), "--json", str(out), "--quiet", "--limit", "1",
                 *([] if stored else ["--no-store"])]) == 0
    printed = capsys.readouterr().out
    assert "baseline" in printed and "95% CI" in printed and "passkey@384" in printed
    data = json.loads(out.read_text())
    assert data["spec"]["name"] == "e2e" and data["seed"] == 5
    assert {"versions", "git_commit", "hardware"} <= data["environment"].keys()
    assert data["environment"]["versions"]["kvpress"] == "0.5.5"
    assert len(data["results"]) == 3 and len(data["summary"]) == 3
    assert any("no baseline config" in w for w in data["warnings"])
    assert summarize([]) == []
    if stored:
        with Store(database) as store:
            [experiment] = store.list_experiments()
            assert experiment.status == "done" and experiment.items_done == 3
            assert [r.to_dict() for r in store.item_results(experiment.id)] == data["results"]
    else:
        assert not (tmp_path / "kvlab.sqlite").exists()


def test_cli_errors_are_messages_not_tracebacks(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVLAB_DATABASE_URL", f"sqlite:///{tmp_path / 'kvlab.sqlite'}")
    bad = tmp_path / "bad.toml"
    bad.write_text('[[tasks]]\nname = "passkey"\n[[configs]]\nquant = "int3"\n')
    assert main(["run", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "bad.toml: configs.0.quant" in err and "Traceback" not in err
    assert main(["run", str(tmp_path / "nope.toml")]) == 2
    two_bit = tmp_path / "two_bit.toml"
    two_bit.write_text('[backend]\nkind = "vllm"\n[[tasks]]\nname = "passkey"\n[[configs]]\nquant = "int2"\n')
    assert main(["run", str(two_bit)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "fp8_e4m3" in err and "Traceback" not in err
    no_vllm = tmp_path / "no_vllm.toml"  # an interpreter without vLLM: kvlab's own (its install is elsewhere)
    no_vllm.write_text(f'[backend]\nkind = "vllm"\n[backend.server]\npython = "{sys.executable}"\n'
                       '[[tasks]]\nname = "passkey"\n[[configs]]\nname = "b"\n')
    assert main(["run", str(no_vllm)]) == 2
    err = capsys.readouterr().err
    assert "vllm is not installed" in err and "scripts/install_vllm.sh" in err
    assert not (tmp_path / "kvlab.sqlite").exists()  # refused before anything is stored

"""Issue 47, row 2, retried as written (a real SQLite store, the real CLI, the real app through AppTest, the
real default model for the worker):

    "A cancelled tune reads three ways (medium): `/new` -> Tune, max candidates 20 -> Launch -> Cancel after
    ~25 s -> "Yes, cancel". After a reload `/tune?id=4` shows "0 of 20 trials done · 4 active" and its
    candidates "running or waiting for its next round", the recommendation box "The tune is cancelled:
    cancelled."; item evaluations still went from 15 to 20 after the cancel; `/experiments` gives the
    cancelled tune a sweet spot (int4/g64/r64 at 2.75x) and `kvlab show 4` lists cancelled trials with
    "accept" verdicts. A cancelled run states one thing everywhere: what finished, what did not, and no
    recommendation drawn from an unfinished search unless labelled as partial."

The tune is stored as its driver and workers store one (tests/tune_data.py's synthetic results: no model):
its first round judged (every candidate promising, "accept" on its first items), the second round under
way, then the store's cancel -- what the tune page's "Yes, cancel" calls.  The same for a plain sweep
cancelled half-way (tests/dashboard_data.py).
"""

from __future__ import annotations

import pytest

from kvlab.cli.main import main
from kvlab.core.experiment_spec import parse_spec
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.tune_spec import candidate_grid
from kvlab.dashboard import experiments_list, page_table
from kvlab.engines.base import Engine
from kvlab.experiments.worker import Worker
from kvlab.experiments.worker_settings import WorkerSettings
from kvlab.store import Store
from kvlab.tune import progress
from pages.tune_view import progress_text
from tests import dashboard_data as sweep_data
from tests.dashboard.test_dashboard import assert_clean, open_page, texts
from tests.tune_data import CANDIDATES, FIRST_ROUND, N_ITEMS, SPEC, item_result

#: "max candidates 20"; the synthetic space holds fewer, so the most it runs is the space's size.
CANCELLED_SPEC = SPEC | {"name": "cancelled-tune", "tune": SPEC["tune"] | {"max_trials": 20}}
PROMISING = ("int8", "int4", "snapkv")
WORKER_ID = "test-host:w0"


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A real SQLite store, the one the CLI and the app open (KVLAB_DATABASE_URL)."""
    url = f"sqlite:///{tmp_path / 'kvlab.sqlite'}"
    monkeypatch.setenv("KVLAB_DATABASE_URL", url)
    with Store(url) as opened:
        yield opened


def cancelled_mid_round(db: Store) -> int:
    """A tune whose first round is judged (each candidate active, acceptable on its first items) and whose
    second round is under way (two more items of each), cancelled through the store as the page's Cancel does."""
    spec = parse_spec(CANCELLED_SPEC)
    assert spec.tune is not None
    experiment_id = db.create_experiment(spec, {}, item_limit=FIRST_ROUND)
    points = len(candidate_grid(spec.tune))
    db.start_tune(experiment_id, points, (points + 1) * N_ITEMS, "test-host-1-driver")
    baseline = db.trials(experiment_id)[0]
    db.track_trial(experiment_id, baseline.id)
    ids = db.add_candidates(experiment_id, [(CANDIDATES[n][0], i) for i, n in enumerate(PROMISING)], FIRST_ROUND)
    plan = {baseline.id: (KVCacheConfig(), "baseline", 1.0, ())}
    plan |= {trial_id: (CANDIDATES[n][0], n, *CANDIDATES[n][1:]) for trial_id, n in zip(ids, PROMISING, strict=True)}

    def write(items: range, finish: bool) -> None:
        for trial in db.claim_trials(WORKER_ID, max_trials=10, experiment_id=experiment_id):
            config, name, fraction, wrong = plan[trial.id]
            db.set_items_total(trial.id, trial.item_limit or N_ITEMS)
            for item in items:
                db.add_item_result(trial.id, item_result(config, name, fraction, wrong, item))
            if finish:
                db.finish_trial(trial.id, "done", worker_id=WORKER_ID)

    write(range(FIRST_ROUND), finish=True)
    for trial_id, name in zip(ids, PROMISING, strict=True):  # the driver's verdicts after the first round
        wrong = CANDIDATES[name][2]
        accuracy = sum(1 for i in range(FIRST_ROUND) if i not in wrong) / FIRST_ROUND
        db.judge_candidate(trial_id, rung=0, judged_items=FIRST_ROUND, accuracy=accuracy, diff=accuracy - 1,
                           diff_low=accuracy - 1.4, diff_high=accuracy - 0.6, kv_bytes=1e5 * CANDIDATES[name][1],
                           acceptable=True)
    db.extend_trials([baseline.id], N_ITEMS)
    db.extend_trials(ids, N_ITEMS, rung=1)
    write(range(FIRST_ROUND, FIRST_ROUND + 2), finish=False)  # the second round, under way
    db.cancel_experiment(experiment_id)  # "Yes, cancel"
    return experiment_id


def _shown(db: Store, experiment_id: int) -> tuple[list[progress.Point], progress.Budgets]:
    experiment, tune = db.get_experiment(experiment_id), db.tune(experiment_id)
    assert tune is not None
    return progress.of_tune(experiment, tune, db.candidates(experiment_id), db.trials(experiment_id))


def test_the_cancelled_tunes_progress_says_what_finished_and_what_did_not(store):
    tune_id = cancelled_mid_round(store)
    shown, budgets = _shown(store, tune_id)
    assert [p.state for p in shown] == ["unfinished"] * len(PROMISING)
    assert budgets.done == 0 and budgets.active == 0 and budgets.unfinished == len(PROMISING)
    text = progress_text(budgets, running=False)
    assert text.startswith(f"0 of {budgets.most} trials done · {len(PROMISING)} unfinished"), text
    assert "active" not in text
    reasons = {row["reason"] for row in progress.candidate_rows(shown)}
    assert reasons == {"the tune was cancelled before it was judged on every item"}
    assert progress.best_so_far(shown) is None


def test_the_tune_page_after_the_cancel_shows_no_active_candidate_and_no_recommendation(store):
    tune_id = cancelled_mid_round(store)
    at = open_page(page_table.TUNE.script, id=str(tune_id))  # "After a reload `/tune?id=4`"
    assert_clean(at)
    bar = next(e.proto.text for e in at.get("progress"))
    assert "0 of" in bar and f"{len(PROMISING)} unfinished" in bar and "active" not in bar
    table = at.table[0].value
    assert set(table["state"]) == {"unfinished"}
    assert not any("running or waiting" in reason for reason in table["reason"])
    boxes = texts(at.info) + texts(at.warning) + texts(at.success)
    assert "The tune is cancelled: cancelled." not in boxes
    assert "No recommendation: the tune was cancelled before its search finished" in boxes
    assert "Recommended:" not in boxes and "Current best so far" not in boxes


def test_the_list_labels_the_cancelled_tunes_sweet_spot_partial(store):
    tune_id = cancelled_mid_round(store)
    at = open_page()
    assert_clean(at)
    row = at.dataframe[0].value.set_index("name").loc["cancelled-tune"]
    assert row["status"] == "cancelled"
    assert row["sweet spot"] == "-" or "partial: cancelled" in row["sweet spot"], row["sweet spot"]
    assert row["trials"] == f"0 of {_shown(store, tune_id)[1].most} trials done"


def test_kvlab_show_and_ls_of_the_cancelled_tune(store, capsys):
    tune_id = cancelled_mid_round(store)
    assert main(["show", str(tune_id)]) == 0
    out = capsys.readouterr().out
    budgets = _shown(store, tune_id)[1]
    assert (f"tune was cancelled before its search finished: 0 of {budgets.most} trials done, {len(PROMISING)} "
            "unfinished; no recommendation") in out
    head, _, verdicts = out.partition("partial: cancelled")
    assert verdicts, out  # the verdicts come after the label
    assert "accept" not in head.split("tune cancelled")[0]  # no verdict before it
    assert "active" not in out
    assert main(["ls"]) == 0
    listed = next(line for line in capsys.readouterr().out.splitlines() if "cancelled-tune" in line)
    assert " cancelled " in listed


def cancelled_sweep(db: Store) -> int:
    """tests/dashboard_data's sweep with every item of its baseline, int4 and int2 done, cancelled while
    snapkv-50 had done 3 of its 8: its sweet spot (int4) is one of a run that did not finish."""
    sweep_id = db.create_experiment(parse_spec(sweep_data.SPEC | {"name": "cancelled-sweep"}), {})
    for trial in db.claim_trials(WORKER_ID, max_trials=4, experiment_id=sweep_id):
        db.set_items_total(trial.id, 8)
        cut = 3 if trial.config_name == "snapkv-50" else 8
        for index, (length, depth) in enumerate((n, d) for n in (256, 512) for d in (0.1, 0.9) for _ in range(2)):
            if index < cut:
                db.add_item_result(trial.id, sweep_data.item_result(trial.config_name, index, length, depth))
        if cut == 8:
            db.finish_trial(trial.id, "done", worker_id=WORKER_ID)
    db.cancel_experiment(sweep_id)
    return sweep_id


def test_a_cancelled_sweep_is_labelled_partial_in_the_list_and_in_show(store, capsys):
    sweep_id = cancelled_sweep(store)
    rows = experiments_list.experiment_rows([store.get_experiment(sweep_id)],
                                 {sweep_id: _decision(store, sweep_id)})
    assert "partial: cancelled" in rows[0]["sweet spot"], rows[0]["sweet spot"]
    assert main(["show", str(sweep_id)]) == 0
    out = capsys.readouterr().out
    assert "partial: cancelled" in out and out.index("partial: cancelled") < out.index("sweet spot")


def _decision(db: Store, experiment_id: int):
    from kvlab.analysis.summary import decide, summarize
    from kvlab.core.margins import Margins
    from kvlab.store.records import baseline_name

    results = db.item_results(experiment_id)
    baseline = baseline_name(db.trials(experiment_id))
    return decide(summarize(results, baseline, Margins.of(db.get_experiment(experiment_id).spec)), baseline)


def test_no_result_is_stored_for_a_cancelled_trial(store):
    """"item evaluations still went from 15 to 20 after the cancel": the store takes no result for a
    trial that was cancelled."""
    tune_id = cancelled_mid_round(store)
    before = progress.item_evals(store.trials(tune_id))
    late = next(t for t in store.trials(tune_id) if t.position == 1)
    assert late.status == "cancelled"
    config, name, fraction, wrong = CANDIDATES["int8"][0], "int8", CANDIDATES["int8"][1], ()
    assert not store.add_item_result(late.id, item_result(config, name, fraction, wrong, N_ITEMS - 1))
    assert progress.item_evals(store.trials(tune_id)) == before


#: Six items of two configs: twelve evaluations, a few seconds on this machine -- fewer than the worker's
#: default heartbeat (5 s), after which it used to learn of the cancel.
SMALL = {"name": "cancelled-mid-batch", "seed": 1,
         "tasks": [{"name": "passkey", "context_lengths": [256], "depths": [0.5], "num_items": 6,
                    "max_new_tokens": 2}],
         "configs": [{"name": "baseline"}, {"name": "int8", "quant": "int8"}]}


class _CancelsAfter:
    """The real embedded engine; the experiment is cancelled (as the page's Cancel does) once ``after``
    results have come out; counts the results it gives after that."""

    def __init__(self, engine: Engine, cancel, after: int) -> None:
        self._engine, self._cancel, self._after = engine, cancel, after
        self.results = 0
        self.after_cancel = 0

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def evaluate_many(self, work):  # one result at a time, through evaluate
        return Engine.evaluate_many(self, work)

    def evaluate(self, item, configs):
        for result in self._engine.evaluate(item, configs):
            if self.results == self._after:
                self._cancel()
            if self.results >= self._after:
                self.after_cancel += 1
            self.results += 1
            yield result

    def close(self):
        pass  # the session's engine stays loaded


@pytest.mark.model
def test_the_worker_stops_at_the_first_result_after_the_cancel(store, engine):
    """The worker's batch stops at its first result the store refuses, not at its next heartbeat (5 s by
    default): no evaluation is stored after the cancel, and at most the one in flight is made."""
    experiment_id = store.create_experiment(parse_spec(SMALL), {})
    cancelling = _CancelsAfter(engine, lambda: store.cancel_experiment(experiment_id), after=3)
    Worker(store, WorkerSettings(poll_s=0.1, exit_when_idle=True),
           engine_factory=lambda spec: cancelling).run()
    assert store.get_experiment(experiment_id).status == "cancelled"
    assert len(store.item_results(experiment_id)) == 3  # those before the cancel
    assert sum(t.items_done for t in store.trials(experiment_id)) == 3
    assert cancelling.after_cancel == 1, cancelling.after_cancel  # the one in flight, refused; then it stopped

"""CLI commands on the experiment store: worker, ls, show, notes, compare, cancel, rerun, export, db."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kvlab.cli.exits import UserError
from kvlab.cli.options import add_margin_options, int_between, margin_overrides, non_negative_int, positive_int
from kvlab.cli.outputs import check_output, shown, write_output
from kvlab.experiments.launcher import MAX_LOCAL_WORKERS
from kvlab.secrets import redact

if TYPE_CHECKING:
    from kvlab.analysis.agreement import EngineFidelity
    from kvlab.core.results import ItemResult


def _store():
    from kvlab.store import Store

    return Store()


def cmd_worker(args: argparse.Namespace) -> int:
    """Exit 0 when stopped or idle; 2 for a bad option (before anything is claimed); 1 when the
    worker gave up on its host or left experiments it could not run to other workers."""
    from kvlab.experiments.worker_settings import WorkerSettings

    settings = WorkerSettings(max_trials=args.max_trials, heartbeat_s=args.heartbeat_s,
                              stale_after_s=args.stale_after_s, on_stale=args.on_stale,
                              telemetry_hz=args.telemetry_hz, threads=args.threads, backoff_s=args.backoff_s,
                              max_failures=args.max_failures, exit_when_idle=args.exit_when_idle)
    from kvlab.experiments.worker import Worker, WorkerGaveUp
    from kvlab.store import Store
    from kvlab.threads import set_torch_threads

    set_torch_threads(settings.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    worker = Worker(Store(), settings)
    try:
        worker.run()
    except KeyboardInterrupt:
        worker.stop()
        return 0
    except WorkerGaveUp as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    left = worker.left_behind()
    if left:
        first, why = next(iter(left.items()))
        print(f"error: worker {worker.worker_id} left experiment(s) {', '.join(map(str, left))} in the queue for "
              f"other workers: this host cannot run them ({redact(why)}); details in their events "
              f"(`kvlab show {first}`)", file=sys.stderr)
        return 1
    return 0


def submit_background(spec, warnings: list[str], workers: int) -> int:
    """Store the experiment, start local workers, print how to follow it."""
    from kvlab.experiments.submit import LocalWorkers, submit
    from kvlab.store.database import shown_url

    experiment_id = submit(spec, LocalWorkers(workers), warnings).experiment_id
    print(f"experiment {experiment_id} queued on {shown_url()} with {len(spec.all_configs())} trials; "
          f"{workers} local worker(s) started")
    print(f"follow it: kvlab show {experiment_id}    stop it: kvlab cancel {experiment_id}")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    experiments = _store().list_experiments(status=args.status, search=args.search, tag=args.tag, limit=args.limit)
    if not experiments:
        print("no experiments yet: `kvlab run SPEC --background` queues one")
        return 0
    print(f"{'id':>5}  {'status':9}  {'trials':>9}  {'items':>11}  {'created (UTC)':19}  name")
    for e in experiments:
        print(f"{e.id:>5}  {shown(e.status):9}  {e.trials_done:>4}/{e.trials_total:<4}  "
              f"{e.items_done:>5}/{e.items_total:<5}  {e.created_at:%Y-%m-%d %H:%M:%S}  {shown(e.name)}"
              + (f"  [{', '.join(map(shown, e.tags))}]" if e.tags else ""))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    store = _store()
    experiment = store.get_experiment(args.id)
    trials = store.trials(args.id)
    print(f"experiment {experiment.id} '{shown(experiment.name)}': {shown(experiment.status)}, model "
          f"{shown(experiment.model)} ({shown(experiment.backend_kind)}), seed {experiment.seed}, "
          f"commit {shown(experiment.git_commit or '-')}")
    if experiment.notes:  # stored redacted (Store.set_notes); edited with `kvlab notes` or on the experiment page
        print("notes: " + shown(redact(experiment.notes), lines=True).replace("\n", "\n       "))
    print(f"{'trial':>6}  {'status':9}  {'items':>9}  {'att':>3}  config")
    for t in trials:
        print(f"{t.id:>6}  {shown(t.status):9}  {t.items_done:>4}/{t.items_total or 0:<4}  {t.attempts:>3}  "
              f"{shown(t.config_name)}" + (f"   error: {shown(redact(t.error))}" if t.error else ""))
    tune = store.tune(args.id)
    if tune is not None:
        from kvlab.tune import progress
        from kvlab.tune.recommend import describe

        candidates, counts = progress.of_tune(experiment, tune, store.candidates(args.id), trials)
        note = f"; {shown(tune.note)}" if tune.note and tune.note != tune.state else ""
        ending = progress.ending_text(tune.state, counts)
        stopped = sum(1 for c in candidates if c.state == "stopped")
        head = (f"{ending}; no recommendation" if ending
                else f"{shown(tune.state)}: {stopped} candidate(s) stopped early")
        print(f"\ntune {head}{note} (the dashboard's /tune?id={args.id})")
        if tune.recommendation:
            print(shown("\n".join(describe(tune.recommendation)), lines=True))
    results = store.item_results(args.id)
    if results and experiment.partial:
        cut = ", ".join(f"{shown(t.config_name)} ({t.items_done}/{t.items_total or '?'} items)" for t in trials
                        if t.status in ("cancelled", "failed"))
        print(f"\n{experiment.partial} -- the run did not finish; the verdicts and the sweet spot below rest on the "
              f"{len(results)} evaluations done before it ended, not on the whole run"
              + (f" (not finished: {cut})" if cut else ""))
    if results:
        from kvlab.analysis.summary import summarize  # scipy: imported only when there is something to summarise
        from kvlab.core.margins import Margins
        from kvlab.experiments.report import render
        from kvlab.store.records import baseline_name

        # names escaped before the tables are laid out: a newline in one cannot forge a row
        results = [replace(r, config_name=shown(r.config_name), task=shown(r.task)) for r in results]
        baseline = shown(baseline_name(trials))
        print()
        margins = Margins.of(experiment.spec | margin_overrides(args))
        load = [replace(level, config_name=shown(level.config_name)) for level in store.load_levels(args.id)]
        from kvlab.core.load_spec import stored_load_target

        target = stored_load_target(experiment.spec)
        print(shown(render(summarize(results, baseline, margins), results, baseline, load=load, target=target),
                    lines=True))
        if experiment.partial:
            print(f"({experiment.partial} -- the sweet spot above is not the run's answer)")
    events = store.events(args.id)[-args.events:] if args.events else []
    if events:
        print("\nrecent events:")
        for event in events:
            print(f"  {shown(event.level):7} {shown(redact(event.message))}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """The same spec on several engines (:mod:`kvlab.analysis.agreement`): two experiments config by config, and
    every experiment's configs side by side, each against its own engine's baseline."""
    ids = list(dict.fromkeys(args.ids))  # each experiment once, in the order given
    if len(ids) < 2:
        raise UserError(f"kvlab compare: give two or more different experiment ids (got {ids[0]} alone)")
    if repeated := sorted({i for i in args.ids if args.ids.count(i) > 1}):
        print(f"note: experiment(s) {', '.join(map(str, repeated))} named more than once: compared once",
              file=sys.stderr)
    store = _store()
    experiments = [store.get_experiment(i) for i in ids]
    results = {e.id: store.item_results(e.id) for e in experiments}
    if empty := [e for e in experiments if not results[e.id]]:
        raise UserError("kvlab compare: " + "; ".join(f"experiment {e.id} '{shown(e.name)}' ({e.status}) has no "
                                                      "results" for e in empty) + ": nothing to compare it on")
    from kvlab.analysis.agreement import different_items

    if note := different_items(list(results.items())):
        print(f"note: {shown(note)}")
    if len(experiments) == 2:
        _pairwise(results, *experiments)
    _engines(results, experiments)
    _floors(store, results, experiments)
    _baselines_against_each_other(results, *experiments)
    return 0


def _floors(store: Any, results: dict[int, list[ItemResult]], experiments: list[Any]) -> None:
    """Each server experiment's noise floor (:mod:`kvlab.analysis.noise_floor`): the KL below which its engine
    cannot tell a config from its own baseline (its first trial)."""
    from kvlab.analysis.noise_floor import noise_floor, under_load_lines

    for experiment in experiments:
        trials = store.trials(experiment.id)
        floor = noise_floor(results[experiment.id], trials[0].config_name) if trials else None
        if floor is not None:
            print(f"experiment {experiment.id} ({shown(experiment.backend_kind)}): {floor.words()}")
            for line in under_load_lines(store.load_levels(experiment.id, trials[0].id), trials[0].config_name):
                print(f"  {line}")


def _engines(results: dict[int, list[ItemResult]], experiments: list[Any]) -> None:
    """Every experiment's configs on the items all of them ran (:func:`kvlab.analysis.agreement.engines_table`)."""
    from kvlab.analysis.agreement import engines_table

    rows = engines_table([(e.id, e.backend_kind, results[e.id]) for e in experiments])
    if not rows:
        print(f"experiments {', '.join(str(e.id) for e in experiments)} share no item without an error: no engines "
              "table")
        return
    shared = max(row.items for row in rows)
    print(f"\nevery engine's configs on the {shared} item(s) all of these experiments ran, each against its own "
          "baseline:")
    print(f"{'experiment':>10}  {'engine':14} {'config':24} {'items':>5}  {'accuracy':>8}  {'KV B/token':>11}  "
          f"{'mean KL [95% CI]':>26}  {'agree':>6}  estimator")
    for row in rows:
        fidelity = row.fidelity
        print(f"{row.experiment_id:>10}  {shown(row.engine)[:14]:14} {shown(row.config_name)[:24]:24} {row.items:>5}  "
              f"{_number(row.accuracy, form='.2f'):>8}  {_number(row.kv_bytes, row.estimated):>11}  "
              f"{_kl(fidelity):>26}  {_number(fidelity.agreement if fidelity else None, form='.1%'):>6}  "
              f"{fidelity.teacher if fidelity else '-'}")


def _number(value: float | None, estimated: bool = False, form: str = ",.0f") -> str:
    return "-" if value is None else ("≈" if estimated else "") + format(value, form)


def _pairwise(results: dict[int, list[ItemResult]], a: Any, b: Any) -> None:
    """Two experiments config by config: the configs both ran, paired item by item."""
    from kvlab.analysis.agreement import engine_agreement

    rows = engine_agreement(results[a.id], results[b.id])
    if not rows:
        print(f"experiments {a.id} and {b.id} share no config and item without an error: nothing to pair")
        return
    print(f"A = experiment {a.id} '{shown(a.name)}' ({shown(a.backend_kind)}), "
          f"B = experiment {b.id} '{shown(b.name)}' ({shown(b.backend_kind)})")
    print(f"{'config':24} {'items':>5}  {'acc A':>6} {'acc B':>6}  {'same outcome':>12}  {'same text':>9}  "
          f"{'KV B/token A':>12}  {'KV B/token B':>12}  {'mean KL A [95% CI]':>22}  {'mean KL B [95% CI]':>22}")
    number = _number
    for row in rows:
        print(f"{shown(row.config_name)[:24]:24} {row.items:>5}  {number(row.accuracy_a, form='.2f'):>6} "
              f"{number(row.accuracy_b, form='.2f'):>6}  {number(row.same_outcome, form='.0%'):>12}  "
              f"{number(row.same_text, form='.0%'):>9}  {number(row.kv_bytes_a, row.estimated_a):>12}  "
              f"{number(row.kv_bytes_b, row.estimated_b):>12}  {_kl(row.fidelity_a):>22}  {_kl(row.fidelity_b):>22}")
    print("≈: estimated from a server's pool (bytes per token x prompt tokens); otherwise measured from tensors")
    teachers = {f"{side}: {f.teacher}" for row in rows for side, f in (("A", row.fidelity_a), ("B", row.fidelity_b))
                if f is not None}
    if teachers:
        print("mean KL: each engine's config against that engine's own baseline, over the paired items; measured on "
              + "; ".join(sorted(teachers)))


def _baselines_against_each_other(results: dict[int, list[ItemResult]], *experiments: Any) -> None:
    """Where one experiment ran on the embedded engine and the other kept its baseline's sampled continuations
    (a server's), how far that server's baseline is from the embedded engine's
    (:mod:`kvlab.experiments.cross_engine`)."""
    from kvlab.core.backends import BACKENDS

    embedded = [e for e in experiments if BACKENDS.get(e.backend_kind) and BACKENDS[e.backend_kind].loads_model_here]
    others = [e for e in experiments if e not in embedded]
    if not embedded or not others:
        return
    from kvlab.experiments.cross_engine import baseline_kl_to_embedded, references

    for served in others:
        refs = references(results[served.id])
        if not refs:
            continue
        summary = baseline_kl_to_embedded(refs, embedded[0].spec["model"])
        if summary is not None:
            low, high = summary.kl_interval()
            print(f"baselines: KL({shown(served.backend_kind)} #{served.id}'s baseline || the embedded engine's) "
                  f"{summary.mean_kl:.3g} [{low:.3g}, {high:.3g}], top-1 agreement {summary.agreement:.1%} over "
                  f"{summary.items} items: the server's sampled continuations scored by the embedded float32 model "
                  "(the floor below which the two engines cannot tell KV settings apart)")


def _kl(fidelity: EngineFidelity | None) -> str:
    return "-" if fidelity is None else fidelity.text


def cmd_cancel(args: argparse.Namespace) -> int:
    count = _store().cancel_experiment(args.id)
    print(f"experiment {args.id}: {count} trial(s) cancelled")
    return 0


def cmd_notes(args: argparse.Namespace) -> int:
    """Print an experiment's notes, or replace them (the text, a file's, or none with ``--clear``), as the
    dashboard's experiment page does: stored redacted, a URL's password or a known key masked."""
    store = _store()
    if args.text is None and args.file is None and not args.clear:
        notes = store.get_experiment(args.id).notes
        print(shown(redact(notes), lines=True) if notes else f"experiment {args.id} has no notes")
        return 0
    if sum((args.text is not None, args.file is not None, args.clear)) > 1:
        raise UserError("kvlab notes: give the notes as TEXT, --file or --clear, one of them")
    text = "" if args.clear else args.text if args.text is not None else _read_notes(args.file)
    stored = store.set_notes(args.id, text)
    print(f"experiment {args.id}: notes " + ("cleared" if not stored else "saved"
                                              + ("; a secret in them was masked" if stored != text else "")))
    return 0


def _read_notes(path: str) -> str:
    """A notes file's text (``-``: standard input), its final newline dropped.

    At most ``MAX_NOTES_CHARS`` characters and that newline are read (UTF-8: four bytes a character at
    most): more is refused without reading on, so ``--file /dev/zero`` or an endless pipe (``yes |``)
    is one line, not a process that grows until memory runs out."""
    from kvlab.core.limits import MAX_NOTES_CHARS

    name = "standard input" if path == "-" else repr(path)
    try:
        with open(sys.stdin.fileno() if path == "-" else path, encoding="utf-8", closefd=path != "-") as handle:
            text = handle.read(MAX_NOTES_CHARS + 2).removesuffix("\n")
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"kvlab notes --file: cannot read {name}: {error}") from None
    if len(text) > MAX_NOTES_CHARS:
        raise UserError(f"kvlab notes --file: {name} holds more than {MAX_NOTES_CHARS:,} characters; at most "
                        f"{MAX_NOTES_CHARS:,} (the notes are unchanged)")
    return text


def cmd_rerun(args: argparse.Namespace) -> int:
    from kvlab.experiments.submit import rerun

    new_id = rerun(args.id, args.workers)
    print(f"experiment {new_id} queued (a rerun of {args.id}); {args.workers} local worker(s) started"
          + ("" if args.workers else ": start workers with `kvlab worker`"))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    store = _store()
    store.get_experiment(args.id)  # an unknown id, before the (scipy) imports below
    # after it: a refused command creates no directory
    out = check_output(args.out, "--out", create_parents=True) if args.out else None
    from kvlab.experiments.export import experiment_document, results_csv

    if args.format == "csv":
        text = results_csv(store.item_results(args.id))
    else:
        text = json.dumps(experiment_document(store, args.id), indent=1)
    if out:
        write_output(out, text, "--out")
        print(f"wrote {out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    """``upgrade`` migrates an empty or older kvlab database; both refuse (exit 2) a database of a newer
    kvlab or of another application."""
    from kvlab.store import SchemaOutdatedError, Store, head_revision

    store = Store(create=False, check=False)
    if args.action == "upgrade":
        before, after = store.upgrade()
        print(f"{store.url}: schema {before or 'empty'} -> {after}")
        return 0
    try:
        store.check_schema()
    except SchemaOutdatedError as outdated:
        print(f"{store.url}: schema {store.schema_revision() or 'empty'}; {outdated}")
    else:
        print(f"{store.url}: schema {head_revision()} (current)")
    return 0


def add_store_commands(sub: argparse._SubParsersAction) -> None:
    worker = sub.add_parser("worker", help="run a worker that claims queued trials (KVLAB_DATABASE_URL)")
    worker.add_argument("--max-trials", type=int, default=4, help="configs claimed together (they share prefills)")
    worker.add_argument("--heartbeat-s", type=float, default=5.0, help="seconds between a worker's signs of life")
    worker.add_argument("--stale-after-s", type=float, default=60.0,
                        help="requeue trials of workers silent this long (at least twice --heartbeat-s)")
    worker.add_argument("--on-stale", choices=["requeue", "fail"], default="requeue",
                        help="what to do with a silent worker's trials (default: %(default)s)")
    worker.add_argument("--telemetry-hz", type=float, default=1.0, help="sampling rate, 0.1..20")
    worker.add_argument("--threads", type=int, help="torch CPU threads (default: the cores this process may use; "
                        "local workers started together split them)")
    worker.add_argument("--backoff-s", type=float, default=600.0,
                        help="leave an experiment this host could not run to other workers for this long")
    worker.add_argument("--max-failures", type=int, default=3,
                        help="stop (exit 1) after this many batches in a row failed for reasons of this host")
    worker.add_argument("--exit-when-idle", action="store_true", help="stop when nothing is queued")
    worker.set_defaults(func=cmd_worker)
    ls = sub.add_parser("ls", help="list experiments")
    ls.add_argument("--status", choices=["queued", "running", "done", "failed", "cancelled"],
                    help="only experiments in this state")
    ls.add_argument("--search", help="substring of the name")
    ls.add_argument("--tag", help="only experiments with this tag")
    ls.add_argument("--limit", type=positive_int, default=50, help="at most this many (default: %(default)s)")
    ls.set_defaults(func=cmd_ls)
    show = sub.add_parser("show", help="an experiment's notes, trials, summary and events")
    show.add_argument("id", type=positive_int, help="the experiment's id (`kvlab ls`)")
    add_margin_options(show, "the experiment's")
    show.add_argument("--events", type=non_negative_int, default=10, help="how many recent events to print (0: none)")
    show.set_defaults(func=cmd_show)
    notes = sub.add_parser("notes", help="print an experiment's notes, or replace them (as its dashboard page does)")
    notes.add_argument("id", type=positive_int, help="the experiment's id")
    notes.add_argument("text", nargs="?",
                       help="the new notes (quote them; after -- when they start with -); none: print the notes")
    notes.add_argument("--file", help="read the new notes from this file (-: standard input)")
    notes.add_argument("--clear", action="store_true", help="remove the notes")
    notes.set_defaults(func=cmd_notes)
    compare = sub.add_parser("compare", help="the same spec on two or more engines: of two, per config both "
                             "accuracies, how often outcomes and texts agree, both KV bytes; of any number, every "
                             "engine's configs on the items all ran, each against its own baseline, and each server's "
                             "baseline against the embedded engine's")
    compare.add_argument("ids", type=positive_int, nargs="+", metavar="ID",
                         help="two or more experiment ids: the same spec on the embedded engine, vLLM, llama.cpp ...")
    compare.set_defaults(func=cmd_compare)
    cancel = sub.add_parser("cancel", help="cancel an experiment's queued and running trials")
    cancel.add_argument("id", type=positive_int, help="the experiment's id")
    cancel.set_defaults(func=cmd_cancel)
    rerun = sub.add_parser("rerun", help="queue the same spec again as a new experiment and start a local worker")
    rerun.add_argument("id", type=positive_int, help="the experiment whose spec to run again")
    rerun.add_argument("--workers", type=int_between(0, MAX_LOCAL_WORKERS), default=1,
                       help=f"local workers to start (0: none; at most {MAX_LOCAL_WORKERS})")
    rerun.set_defaults(func=cmd_rerun)
    export = sub.add_parser("export", help="an experiment's results as CSV or JSON")
    export.add_argument("id", type=positive_int, help="the experiment's id")
    export.add_argument("--format", choices=["csv", "json"], default="json",
                        help="csv: one row per item result; json: everything (default: %(default)s)")
    export.add_argument("--out", help="file to write, its directory created if need be; not a symbolic link "
                        "(default: stdout)")
    export.set_defaults(func=cmd_export)
    db = sub.add_parser("db", help="database schema")
    db.add_argument("action", choices=["upgrade", "status"],
                    help="upgrade: migrate the schema to this kvlab's; status: show its revision")
    db.set_defaults(func=cmd_db)

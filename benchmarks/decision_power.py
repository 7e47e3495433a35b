"""Decision power: how many items accuracy and fidelity each need to certify a config.

On examples/quick.toml's configs and items (its embedded run, or a ``kvlab run --json`` file of it),
for each config: the smallest prefix of the items, interleaved over context lengths
(kvlab.experiments.runner.interleave), on which the config is acceptable, with Holm across all the
spec's configs, under each criterion:
  accuracy   accuracy non-inferior within 5 points (``Margins(max_drop=0.05, max_kl=0)``);
  KL         mean KL certified below DEFAULT_MAX_KL nats per token and accuracy not shown to drop by
             more than 5 points (``Margins(max_drop=0.05, max_kl=DEFAULT_MAX_KL)``);
  agreement  top-1 agreement certified above 90%, accuracy likewise (``min_agreement=0.9``).
Each prefix is judged by kvlab.analysis.summary.summarize on the results of its items: no model
runs beyond the one run.  "> N": not acceptable even on all N items; for accuracy, the items
kvlab.analysis.decision.items_needed extrapolates for a config exactly as accurate as the baseline
follow in brackets.  A "*" marks a config accepted on that prefix but not on all N items.

Then whether the criteria rank the configs alike: Spearman's rho across configs between the accuracy
difference against the baseline and the mean KL (they agree when rho is negative: more accurate,
closer to the baseline), and between the difference and the agreement (positive), on all N items;
and "fidelity needs X of the items accuracy needs" over the configs both criteria certify.  Counts of
items do not depend on the machine's load.

With --sampled, the same for the sampled estimator (issue 35), side by side with the exact one in one table.
The exact estimator is the embedded engine's per-token KL(baseline || config) on the baseline's *greedy* tokens
(every row of both distributions).  The sampled estimator is what a server's log-probabilities allow
(kvlab.engines.server_fidelity), computed here in-process by the code ``kvlab serve`` answers with: per item the
baseline samples a continuation at temperature 1 with the item's seed (``item_seed(spec.seed, item_id)``;
``StreamingEngine.stream`` with ``Sampling(1.0, seed)``, no stop string, ``max_new_tokens`` tokens unless the end
token comes first), then the baseline and each config score prompt + continuation teacher-forced
(``StreamingEngine.forced_logprobs``: ``stream`` with a ``PromptScorer``, what ``prompt_logprobs`` reads), the
prompt split into context and question as kvlab serve splits it with ``kv_cache_question_chars``; per token
``log p(y) - log q(y)`` and top-1 equality (``server_fidelity.fidelity``).  Its prefix count runs the same
``summarize`` on the same results with each config's fidelity replaced by the sampled one.

Its variance (kvlab.analysis.sampled_kl).  At position t of an item's sampled trajectory y_1 .. y_T, with p_t,
q_t the baseline's and the config's distributions given y_<t: d_t = log p_t(y_t) - log q_t(y_t), KL_t =
E_{y~p_t}[d], V_t = Var_{y~p_t}[d] = sum_y p_t(y) (log p_t(y) - log q_t(y) - KL_t)^2.  The item's estimate
m = (1/T) sum_t d_t has Var(m) = (1/T^2) [sum_t Var(d_t) + sum_{s != t} Cov(d_s, d_t)].  Split d_t = KL_t + e_t:
k = (1/T) sum_t KL_t is the exact mean KL along the same tokens (the full rows give it), and the draw noise e_t
has mean 0 given y_<t, which fixes every earlier e_s (martingale differences): the e_t are uncorrelated and
E[e_t^2] = E[V_t], so w = (1/T^2) sum_t V_t estimates E[(m - k)^2] without bias.  The covariances across
positions of one trajectory are those of the states (KL_s, s > t, moves with y_t): Var(m) = Var(k) + E[w] +
2 Cov(k, m - k).  Over items, the unit of the t interval (kvlab.analysis.fidelity): s_m^2 = s_k^2 (between
items: the spread of the exact trajectory means) + mean(w) (within: one draw per position) + 2 cov(k, m - k), up
to the noise of mean(w); a config is certified on n items when mean + t(1 - alpha, n - 1) s_m / sqrt(n) < max_kl,
i.e. n ~ (t s_m / (max_kl - mean))^2.  The exact estimator's n uses its own s over the greedy item means (no w).
The table gives that n ("n~"; Holm across the configs: the config of the j-th largest margin in standard
deviations tested at alpha / (m - j), and certified only once every better one is:
kvlab.analysis.fidelity.holm_items_to_certify) from the N-item means and standard deviations, beside the prefix
count each estimator actually reaches, their ratios, and the sampled estimator's measured parts (between,
within, 2cov, their sum, and the total s_m^2).

Usage: python benchmarks/decision_power.py [--spec examples/quick.toml] [--configs NAME,...] [--sampled]
       [--limit N] [--json OUT] [--from-json IN] [--save-run OUT]
(IN: written by `kvlab run examples/quick.toml --json IN`, or by --save-run: reuses that run;
 --configs: the baseline and these configs alone, each a config of the spec or else a quantization format
 added as one, e.g. --configs int8,int4,fp8_e4m3; run it under `nice`)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvlab.threads import share_cores

share_cores()  # before torch loads (kvlab/threads.py): the machine is shared

from scipy import stats  # noqa: E402

from kvlab.analysis.decision import items_needed  # noqa: E402
from kvlab.analysis.fidelity import holm_items_to_certify  # noqa: E402
from kvlab.analysis.sampled_kl import SampledItem, VarianceComponents  # noqa: E402
from kvlab.analysis.summary import ConfigSummary, summarize  # noqa: E402
from kvlab.core.experiment_spec import ExperimentSpec, parse_spec  # noqa: E402
from kvlab.core.formats import QUANT_NAMES  # noqa: E402
from kvlab.core.items import TaskItem  # noqa: E402
from kvlab.core.kv_config import KVCacheConfig  # noqa: E402
from kvlab.core.margins import DEFAULT_MAX_KL, Margins  # noqa: E402
from kvlab.core.results import Fidelity, ItemResult  # noqa: E402
from kvlab.experiments.runner import build_items, interleave  # noqa: E402

if TYPE_CHECKING:
    from kvlab.engines.embedded import EmbeddedEngine
    from kvlab.engines.embedded_streaming import StreamingEngine

MAX_DROP = 0.05
CRITERIA: dict[str, Margins] = {
    "accuracy": Margins(max_drop=MAX_DROP, max_kl=0),
    "KL": Margins(max_drop=MAX_DROP, max_kl=DEFAULT_MAX_KL),
    "agreement": Margins(max_drop=MAX_DROP, max_kl=0, min_agreement=0.9),
}
FIDELITY_CRITERIA = ("KL", "agreement")

Key = tuple[str, str]  # (item_id, task): how summarize pairs a config's results with the baseline's


@dataclass
class Run:
    """What the benchmark reads of a run: its results, config labels (baseline first) and items in
    interleaved order; for the sampled estimator, its spec and configs (baseline first, as the labels)."""

    results: list[ItemResult]
    configs: list[str]
    order: list[Key]
    spec: ExperimentSpec | None = None
    config_objects: list[KVCacheConfig] = field(default_factory=list)

    @property
    def baseline(self) -> str:
        return self.configs[0]


def item_order(results: Sequence[ItemResult], baseline: str) -> list[Key]:
    """The items, interleaved over (task, context length), in the order the baseline ran them."""
    rows = interleave([r for r in results if r.config_name == baseline])
    return list(dict.fromkeys((r.item_id, r.task) for r in rows))


def from_json(path: Path, names: Sequence[str] = ()) -> Run:
    """A ``kvlab run --json`` file's run (``names``: its baseline and these configs alone)."""
    data = json.loads(path.read_text())
    objects = [KVCacheConfig.model_validate({k: v for k, v in c.items() if k != "label"}) for c in data["configs"]]
    configs = [c["label"] for c in data["configs"]]
    if names:
        missing = sorted(set(names) - set(configs))
        if missing:
            raise SystemExit(f"{path} has no config {', '.join(missing)} (it has {', '.join(configs)})")
        kept = [0] + [i for i, label in enumerate(configs) if label in names and i]
        objects, configs = [objects[i] for i in kept], [configs[i] for i in kept]
    results = [ItemResult(**row) for row in data["results"] if row["config_name"] in configs]
    spec = parse_spec(data["spec"], stored=True) if "spec" in data else None
    return Run(results, configs, item_order(results, configs[0]), spec, objects)


def pick_configs(spec: ExperimentSpec, names: Sequence[str]) -> ExperimentSpec:
    """The spec with its baseline and ``names`` alone, in that order: each a config of the spec (by label), else
    a quantization format added as one (``fp8_e4m3``, which quick.toml lacks)."""
    by_label = {c.label: c for c in spec.all_configs()}
    picked = [spec.all_configs()[0]]
    for name in names:
        if name in by_label:
            picked.append(by_label[name])
        elif name in QUANT_NAMES:
            picked.append(KVCacheConfig(name=name, quant=name))
        else:
            raise SystemExit(f"no config {name!r} in the spec ({', '.join(by_label)}) and no quantization format of "
                             f"that name ({', '.join(QUANT_NAMES)})")
    return spec.model_copy(update={"configs": picked, "sweep": None})


def load_engine(spec: ExperimentSpec) -> StreamingEngine:
    from kvlab.engines.embedded_streaming import StreamingEngine
    from kvlab.models import load_model

    return StreamingEngine(load_model(spec.model), seed=spec.seed)


def run_spec(spec: ExperimentSpec, engine: EmbeddedEngine, limit: int | None, save: Path | None) -> Run:
    from kvlab.experiments.runner import run_experiment

    items = interleave(build_items(spec, engine.tokenizer))[:limit]
    run = run_experiment(spec, engine, progress=True, items=items)
    if run.failure:
        raise SystemExit(f"the run stopped early: {run.failure}")
    if save:
        save.write_text(json.dumps(run.to_dict(), indent=1))
        print(f"wrote the run to {save} (--from-json {save} reuses it)", file=sys.stderr)
    print(f"{len(run.results)} evaluations in {run.wall_s:.0f} s", file=sys.stderr)
    return Run(run.results, [c.label for c in run.configs], item_order(run.results, run.baseline_name), spec,
               list(run.configs))


# -- the sampled estimator -------------------------------------------------------------------------------------


@dataclass
class SampledRun:
    """The sampled estimator on the embedded engine, per config label and item: the :class:`Fidelity` kvlab's
    server path builds (``server_fidelity.fidelity``) and the item's :class:`SampledItem` (estimate, exact KL
    along the same tokens, draw noise); the tokens sampled and the seconds it took."""

    fidelity: dict[str, dict[Key, Fidelity]]
    items: dict[str, dict[Key, SampledItem]]
    tokens: int
    wall_s: float


def run_sampled(engine: StreamingEngine, seed: int, items: Sequence[TaskItem],
                configs: Sequence[KVCacheConfig]) -> SampledRun:
    """Sample each item's continuation under the baseline (``configs[0]``) and score it under every config, as
    ``kvlab serve`` answers the sampled estimator's requests (module docstring)."""
    import torch

    from kvlab.engines.batched_decode import token_kl, token_kl_variance
    from kvlab.engines.prompt_scoring import Sampling
    from kvlab.engines.server_fidelity import Reference, fidelity, item_seed

    baseline, compared = configs[0], list(configs[1:])
    out = SampledRun({c.label: {} for c in compared}, {c.label: {} for c in compared}, 0, 0.0)
    started = time.perf_counter()
    tokenizer = engine.tokenizer
    with torch.no_grad():
        for number, item in enumerate(items, 1):
            # kvlab serve's split of a prompt sent with kv_cache_question_chars (ServedModel.encode): the context
            # with the tokenizer's special tokens, the question tokenized on its own
            context = tokenizer(item.context, add_special_tokens=True)["input_ids"]
            question = tokenizer(item.question, add_special_tokens=False)["input_ids"]
            sample_seed = item_seed(seed, item.item_id)
            # ServerScorer.reference: temperature 1, top_p 1, the item's seed, max_new_tokens, no stop string
            tokens = [t for t in engine.stream(context, question, baseline, item.max_new_tokens,
                                               sampling=Sampling(1.0, sample_seed)) if isinstance(t, int)]
            ids = torch.tensor(tokens).unsqueeze(-1)
            base = engine.forced_logprobs(context, question, tokens, baseline)
            reference = Reference(tuple(context + question), tuple(tokens), tuple(base.gather(-1, ids)[:, 0].tolist()),
                                  tuple(base.argmax(dim=-1).tolist()), sample_seed, (len(context), len(question)))
            key = (item.item_id, item.task)
            for config in compared:
                rows = engine.forced_logprobs(context, question, tokens, config)
                estimate = fidelity(reference, rows.gather(-1, ids)[:, 0].tolist(), rows.argmax(dim=-1).tolist())
                out.fidelity[config.label][key] = estimate
                out.items[config.label][key] = SampledItem.of(estimate.kl, token_kl(base, rows).tolist(),
                                                              token_kl_variance(base, rows).tolist())
            out.tokens += len(tokens)
            print(f"sampled {number}/{len(items)}: {item.item_id} ({len(context) + len(question)} + {len(tokens)} "
                  f"tokens, {time.perf_counter() - started:.0f} s)", file=sys.stderr)
    out.wall_s = time.perf_counter() - started
    return out


def with_sampled(run: Run, sampled: SampledRun) -> Run:
    """The run with each compared config's fidelity replaced by the sampled estimator's (same accuracy)."""
    results = []
    for r in run.results:
        estimate = sampled.fidelity.get(r.config_name, {}).get((r.item_id, r.task))
        results.append(replace(r, extra={**r.extra, "fidelity": estimate.to_dict()}) if estimate is not None else r)
    return Run(results, run.configs, run.order, run.spec, run.config_objects)


def item_means(run: Run, config: str) -> list[float]:
    """The config's per-item mean KL on the run's items (those measured)."""
    keys = set(run.order)
    return [f.mean_kl for r in run.results if r.config_name == config and r.error is None
            and (r.item_id, r.task) in keys and (f := r.fidelity) is not None]


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    return (math.fsum(values) / len(values), statistics.stdev(values)) if len(values) >= 2 else (math.nan, math.nan)


def sampled_table(run: Run, sampled: SampledRun, needed_exact: dict[str, int]) -> list[dict[str, Any]]:
    """Print the exact and the sampled estimator side by side (one row per config) and return the figures."""
    n = len(run.order)
    compared = [c for c in run.configs if c != run.baseline]
    as_sampled = with_sampled(run, sampled)
    needed_sampled = first_accepted(as_sampled, CRITERIA["KL"])
    final_sampled = prefix_summaries(as_sampled, n, CRITERIA["KL"])
    exact = {c: mean_sd(item_means(run, c)) for c in compared}
    parts = {c: VarianceComponents.of([sampled.items[c][k] for k in run.order if k in sampled.items[c]])
             for c in compared}
    formula_exact = holm_items_to_certify({c: v for c, v in exact.items() if not math.isnan(v[0])}, DEFAULT_MAX_KL)
    formula_sampled = holm_items_to_certify({c: (p.mean, p.sd) for c, p in parts.items()}, DEFAULT_MAX_KL)

    def prefix(needed: dict[str, int], config: str) -> str:
        return str(needed[config]) if config in needed else f">{n}"

    def ratio(a: int | None, b: int | None) -> str:
        return f"{a / b:.2f}" if a is not None and b else "-"

    print(f"\nexact vs sampled estimator: items to certify mean KL < {DEFAULT_MAX_KL:g} (Holm across {len(compared)} "
          f"configs) on {n} items; sampled: {sampled.tokens} tokens at temperature 1 in {sampled.wall_s:.0f} s")
    print("  n~: from the N-item mean and sd, n ~ (t * sd / (max_kl - mean))^2 at the Holm level; prefix: the first "
          "prefix the rule certifies ('>N': none); sampled variance over items: s_m^2 = between (exact mean KL "
          "along the sampled tokens) + within (1/T^2 sum V_t) + 2cov")
    print(f"  {'':16} {'exact (greedy tokens)':^29}   {'sampled (temperature 1)':^38}   {'sampled/exact':^13}   "
          f"{'sampled variance over items':^44}")
    print(f"  {'config':16} {'mean KL':>8} {'sd':>8} {'n~':>5} {'prefix':>6}   {'mean KL':>8} {'exact':>8} {'sd':>8} "
          f"{'n~':>5} {'prefix':>6}   {'n~':>6} {'prefix':>6}   {'between':>8} {'within':>8} {'2cov':>9} "
          f"{'sum':>8} {'s_m^2':>8}")
    rows = []
    for c in compared:
        p = parts[c]
        mean_e, sd_e = exact[c]
        print(f"  {c:16} {number(mean_e, '.2e'):>8} {number(sd_e, '.2e'):>8} {formula_exact.get(c) or '-':>5} "
              f"{prefix(needed_exact, c):>6}   {p.mean:>8.2e} {p.exact_mean:>8.2e} {p.sd:>8.2e} "
              f"{formula_sampled[c] or '-':>5} {prefix(needed_sampled, c):>6}   "
              f"{ratio(formula_sampled[c], formula_exact.get(c)):>6} "
              f"{ratio(needed_sampled.get(c), needed_exact.get(c)):>6}   {p.between:>8.2e} {p.within:>8.2e} "
              f"{p.cross:>+9.1e} {p.predicted:>8.2e} {p.total:>8.2e}")
        summary = final_sampled[c]
        rows.append({"config": c, "exact": {"mean_kl": mean_e, "sd": sd_e, "items_formula": formula_exact.get(c),
                                            "items_prefix": needed_exact.get(c)},
                     "sampled": {"mean_kl": p.mean, "exact_kl_on_sampled_tokens": p.exact_mean, "sd": p.sd,
                                 "agreement": summary.agreement, "items_formula": formula_sampled[c],
                                 "items_prefix": needed_sampled.get(c), "accepted_on_all": summary.non_inferior,
                                 "variance": {"total": p.total, "between": p.between, "within": p.within,
                                              "cross": p.cross, "predicted": p.predicted}}})
    return rows


def prefix_summaries(run: Run, n: int, margins: Margins) -> dict[str, ConfigSummary]:
    keys = set(run.order[:n])
    rows = [r for r in run.results if (r.item_id, r.task) in keys]
    return {s.config_name: s for s in summarize(rows, run.baseline, margins)}


def first_accepted(run: Run, margins: Margins) -> dict[str, int]:
    """Per config, the fewest leading items on which it is acceptable (absent: on no prefix)."""
    needed: dict[str, int] = {}
    for n in range(1, len(run.order) + 1):
        for name, summary in prefix_summaries(run, n, margins).items():
            if summary.non_inferior and name not in needed:
                needed[name] = n
    return needed


def spearman(xs: list[float], ys: list[float]) -> tuple[float | None, float | None]:
    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None, None
    result = stats.spearmanr(xs, ys)
    return float(result.statistic), float(result.pvalue)


def number(value: float | None, spec: str) -> str:
    return "-" if value is None or math.isnan(value) else format(value, spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="examples/quick.toml")
    parser.add_argument("--limit", type=int, help="the first N items (interleaved over context lengths)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the figures as JSON")
    parser.add_argument("--from-json", type=Path, metavar="IN", help="read a `kvlab run --json` file: no model run")
    parser.add_argument("--save-run", type=Path, metavar="OUT", help="write the run as `kvlab run --json` does")
    parser.add_argument("--configs", metavar="NAME,...", help="the baseline and these configs alone: configs of the "
                        "spec, or quantization formats added as configs (e.g. int8,int4,fp8_e4m3)")
    parser.add_argument("--sampled", action="store_true", help="also the sampled estimator (temperature-1 "
                        "continuations scored teacher-forced, as kvlab serve answers prompt_logprobs), side by side")
    args = parser.parse_args()
    names = [name.strip() for name in args.configs.split(",") if name.strip()] if args.configs else []
    engine = None
    if args.from_json:
        run = from_json(args.from_json, names)
        run.order = run.order[:args.limit] if args.limit else run.order
    else:
        from kvlab.spec_files import load_spec

        spec, warnings = load_spec(args.spec)
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
        spec = pick_configs(spec, names) if names else spec
        engine = load_engine(spec)
        run = run_spec(spec, engine, args.limit, args.save_run)
    n = len(run.order)
    compared = [c for c in run.configs if c != run.baseline]

    needed = {name: first_accepted(run, margins) for name, margins in CRITERIA.items()}
    final = {name: prefix_summaries(run, n, margins) for name, margins in CRITERIA.items()}
    figures = final["KL"]  # every summary carries the same accuracy and fidelity figures
    baseline_accuracy = figures[run.baseline].accuracy
    extrapolated = (items_needed(baseline_accuracy, MAX_DROP, len(compared)) if baseline_accuracy is not None
                    else None)

    def cell(criterion: str, config: str) -> str:
        summary = final[criterion].get(config)
        if summary is None or summary.non_inferior is None:
            return "n/a"  # no task can judge it (reason in the summary's task verdicts)
        if config in needed[criterion]:
            return f"{needed[criterion][config]}{'' if summary.non_inferior else '*'}"
        if criterion == "accuracy":
            return f"> {n} (~{extrapolated if extrapolated is not None else '> 100000'})"
        return f"> {n}"

    print(f"{n} items (interleaved over task and context length), {len(compared)} configs "
          f"compared with {run.baseline} (accuracy {number(baseline_accuracy, '.2f')}); Holm across all of them")
    print(f"items needed to certify at {MAX_DROP * 100:g} points: accuracy non-inferiority | mean KL < "
          f"{DEFAULT_MAX_KL:g} | agreement > 90%  ('> N (~M)': M extrapolated by items_needed for a config as "
          "accurate as the baseline; '*': accepted there, not on all N)")
    header = (f"  {'config':16} {'acc diff':>8} {'mean KL':>8} {'agree':>6}   "
              f"{'accuracy':>16} {'KL':>6} {'agreement':>9}")
    print(header)
    rows = []
    for config in compared:
        s = figures[config]
        print(f"  {config:16} {number(s.diff_estimate, '+.3f'):>8} {number(s.mean_kl, '.3g'):>8} "
              f"{number(s.agreement, '.1%'):>6}   {cell('accuracy', config):>16} {cell('KL', config):>6} "
              f"{cell('agreement', config):>9}")
        rows.append({"config": config, "diff_vs_baseline": s.diff_estimate, "mean_kl": s.mean_kl,
                     "agreement": s.agreement,
                     "items_needed": {c: needed[c].get(config) for c in CRITERIA},
                     "accepted_on_all": {c: final[c][config].non_inferior for c in CRITERIA}})

    ranked = [figures[c] for c in compared if figures[c].diff_estimate is not None and figures[c].mean_kl is not None]
    diffs = [s.diff_estimate for s in ranked]
    rho_kl, p_kl = spearman(diffs, [s.mean_kl for s in ranked])
    rho_agree, p_agree = spearman(diffs, [s.agreement for s in ranked])
    print(f"ranking across {len(ranked)} configs, Spearman rho: accuracy difference vs mean KL "
          f"{number(rho_kl, '+.2f')} (p {number(p_kl, '.2g')}; negative: the criteria agree), vs agreement "
          f"{number(rho_agree, '+.2f')} (p {number(p_agree, '.2g')}; positive: they agree)")

    ratios: dict[str, Any] = {}
    for criterion in FIDELITY_CRITERIA:
        both = [c for c in compared if c in needed["accuracy"] and c in needed[criterion]]
        if both:
            fidelity_items = sum(needed[criterion][c] for c in both)
            accuracy_items = sum(needed["accuracy"][c] for c in both)
            ratio = fidelity_items / accuracy_items
            print(f"{criterion}: fidelity needs {ratio:.0%} of the items accuracy needs "
                  f"({fidelity_items} / {accuracy_items}, over the {len(both)} configs both certify)")
        else:
            ratio = None
            print(f"{criterion}: no config certified by both accuracy and {criterion} on {n} items")
        only = [c for c in compared if c in needed[criterion] and c not in needed["accuracy"]]
        if only and extrapolated:
            share = sum(needed[criterion][c] for c in only) / (extrapolated * len(only))
            print(f"  {len(only)} config{'s' * (len(only) > 1)} certified by {criterion}, not by accuracy, "
                  f"on {n} items: {share:.0%} of the {extrapolated} items extrapolated for accuracy")
        ratios[criterion] = {"ratio": ratio, "both": both, "fidelity_only": only}

    estimators = None
    if args.sampled:
        if run.spec is None:
            raise SystemExit(f"{args.from_json} holds no spec: the sampled estimator needs its items and model")
        engine = engine or load_engine(run.spec)
        keys = set(run.order)
        items = [i for i in interleave(build_items(run.spec, engine.tokenizer)) if (i.item_id, i.task) in keys]
        sampled = run_sampled(engine, run.spec.seed, items, run.config_objects)
        estimators = sampled_table(run, sampled, needed["KL"])

    if args.json:
        args.json.write_text(json.dumps({
            "items": n, "baseline": run.baseline, "baseline_accuracy": baseline_accuracy, "max_drop": MAX_DROP,
            "max_kl": DEFAULT_MAX_KL, "min_agreement": 0.9, "accuracy_items_extrapolated": extrapolated,
            "configs": rows, "spearman": {"mean_kl": {"rho": rho_kl, "p": p_kl},
                                          "agreement": {"rho": rho_agree, "p": p_agree}},
            "fidelity_over_accuracy": ratios, "estimators": estimators}, indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

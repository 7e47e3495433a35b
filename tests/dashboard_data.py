"""Synthetic experiments for the dashboard and chart tests, written through the Store API as workers would."""

from __future__ import annotations

from dataclasses import replace

from kvlab.core.experiment_spec import parse_spec
from kvlab.core.results import NOISE_FLOOR_KEY, TEACHER_BASELINE_SAMPLE, CacheLayout, Fidelity, ItemResult
from kvlab.load.metrics import LevelResult, ServerReading
from kvlab.store import Store, TelemetrySample

# max_drop 0.5: with 8 items only a wide non-inferiority margin can show a sweet spot.
SPEC = {"name": "synthetic-sweep", "tags": ["nightly"], "max_drop": 0.5,
        "tasks": [{"name": "passkey", "context_lengths": [256, 512], "depths": [0.1, 0.9], "num_items": 4}],
        "configs": [{"name": "int4", "quant": "int4"}, {"name": "int2", "quant": "int2"},
                    {"name": "snapkv-50", "evict": "snapkv", "ratio": 0.5}]}
#: config -> (physical bytes per baseline byte, items it gets wrong out of every 4)
PROFILE = {"baseline": (1.0, 0), "int4": (0.27, 0), "int2": (0.15, 2), "snapkv-50": (0.5, 1)}
#: config -> (KL in nats per token before it diverges, the token at which it diverges on the items it
#: gets wrong): its fidelity to the baseline, teacher-forced on the baseline's FIDELITY_TOKENS tokens.
#: At the default max_kl (0.05) int4 is certified and int2, snapkv-50 are not.
FIDELITY = {"int4": (0.004, None), "int2": (0.4, 1), "snapkv-50": (0.08, 3)}
FIDELITY_TOKENS = 6


def fidelity_of(config: str, item: int) -> Fidelity | None:
    """The config's synthetic fidelity on an item (None for the baseline, as the engine stores it):
    KL varies over tokens and items; on an item the config gets wrong, its top-1 leaves the
    baseline's at its divergence token, and KL is three times higher from there."""
    if config not in FIDELITY:
        return None
    level, diverges = FIDELITY[config]
    at = diverges if item % 4 < PROFILE[config][1] else None
    kl = tuple(level * (0.5 + (item + t) % 4 / 4) * (3 if at is not None and t >= at else 1)
               for t in range(FIDELITY_TOKENS))
    return Fidelity(kl=kl, agree=tuple(at is None or t < at for t in range(FIDELITY_TOKENS)))


def floor_of(item: int) -> Fidelity:
    """The baseline's server against itself on an item (the engine's noise floor, as a server stores it)."""
    return Fidelity(kl=tuple(0.001 * ((item + t) % 5) for t in range(FIDELITY_TOKENS)),
                    agree=(True,) * FIDELITY_TOKENS, teacher=TEACHER_BASELINE_SAMPLE)


def item_result(config: str, item: int, length: int, depth: float, fidelity: bool = False,
                floor: bool = False) -> ItemResult:
    """One passkey item under ``config``; ``fidelity``: with its :func:`fidelity_of` in ``extra``, as
    the embedded engine stores it; ``floor``: the baseline's with the engine's noise floor (:func:`floor_of`)."""
    fraction, wrong = PROFILE[config]
    baseline_bytes = 2 * 30 * 3 * 64 * length * 2
    correct = item % 4 >= wrong
    measured = fidelity_of(config, item) if fidelity else None
    return ItemResult(
        item_id=f"passkey-{length}-{item}", task="passkey", config_name=config,
        config={"name": config, "quant": {"int4": "int4", "int2": "int2"}.get(config, "none"),
                "evict": "snapkv" if config == "snapkv-50" else "none",
                "ratio": 0.5 if config == "snapkv-50" else None},
        seed=0, context_length=length, depth=depth, prompt_tokens=length, context_tokens=length - 20,
        kept_tokens=float(length if config != "snapkv-50" else length // 2), kept_fraction=0.5 if config == "snapkv-50"
        else 1.0, baseline_kv_bytes=baseline_bytes, physical_kv_bytes=int(baseline_bytes * fraction),
        analytic_kv_bytes=int(baseline_bytes * fraction), compression_ratio=1 / fraction, peak_kv_bytes=baseline_bytes,
        generated=" 12345." if correct else " 99999.", answer="12345", output_tokens=4, ttft_s=0.1 * length / 256,
        tpot_s=0.05, prefill_s=0.09 * length / 256, compress_s=0.005, decode_s=0.15, peak_memory_bytes=None,
        score=1.0 if correct else 0.0, extra={"cache_layout": _layout(baseline_bytes * fraction, length - 20, config)}
        | ({} if measured is None else {"fidelity": measured.to_dict()})
        | ({NOISE_FLOOR_KEY: floor_of(item).to_dict()} if floor and config == "baseline" else {}))


def _layout(physical: float, context: int, config: str) -> dict:
    """Where the cache is, as the embedded engine stores it: 30 layers of 3 KV heads (SmolLM2's)."""
    kept = context // 2 if config == "snapkv-50" else context
    return CacheLayout(((kept,) * 3,) * 30, (int(physical / 30),) * 30).to_dict()


#: The synthetic load phase: clients at each closed-loop level, and the baseline's pool in tokens (two sequences).
LOAD_CLIENTS, BASE_POOL_TOKENS = (1, 2, 4), 1_408


def load_level(config: str, clients: int) -> LevelResult:
    """A config's server at ``clients`` clients, as a pool ``1 / bytes-per-baseline-byte`` times the baseline's
    would serve them: the requests that fit run (two per baseline pool), the rest wait; each running request
    streams 10 tokens/s."""
    ratio = PROFILE[config][0]
    running = min(clients, int(2 / ratio))
    latency = {"ttft": {"mean": 100.0 * clients / running, "p50": 100.0, "p90": 150.0 * clients / running,
                        "p99": 200.0 * clients / running},
               "tpot": {"mean": 100.0, "p50": 100.0, "p90": 110.0, "p99": 120.0}, "itl": None,
               "e2el": {"mean": 1600.0, "p50": 1600.0, "p90": 1700.0, "p99": 1800.0 * clients / running}}
    return LevelResult("closed", float(clients), 8, 8, 0, None, 8 / running * 1.6, running / 1.6, 10.0 * running,
                       10.0 * running + 300.0 * running / 1.6, 8 * 300, 8 * 16, latency,
                       ServerReading(running, clients - running, 0, min(1.0, running * ratio / 2), 20),
                       round(BASE_POOL_TOKENS / ratio))


def populate(store: Store, name: str = "synthetic-sweep", finish: bool = True, fidelity: bool = False,
             load: bool = False, floor: bool = False) -> int:
    """An experiment of 4 configs x 8 passkey items (2 lengths x 2 depths x 2), with telemetry and
    events; ``finish=False`` leaves it running with half of the items done.  Without ``fidelity`` its
    results are those of a backend that does not measure it (accuracy decides); with it, every
    config but the baseline carries its fidelity to the baseline (then fidelity decides).  ``load``: each
    config's server also under a load phase (:func:`load_level`), as a [load] table stores it; ``floor``: the
    baseline's items carry the engine's noise floor, as a server experiment's do (with ``load``, its level of the
    most clients too: the floor scored under that load, twice the quiet one)."""
    spec = parse_spec(SPEC | {"name": name})
    experiment_id = store.create_experiment(spec, {"versions": {"kvlab": "test"}, "git_commit": "abc123",
                                                   "hardware": {"cpu_count": 2}})
    trials = store.claim_trials("test-host:w0", max_trials=4, experiment_id=experiment_id)
    samples = []
    for trial in trials:
        store.set_items_total(trial.id, 8)
        for index, (length, depth) in enumerate((n, d) for n in (256, 512) for d in (0.1, 0.9) for _ in range(2)):
            if not finish and index >= 4:
                break
            store.add_item_result(trial.id, item_result(trial.config_name, index, length, depth, fidelity, floor))
        for step, phase in enumerate(("load", "prefill", "compress", "decode")):
            samples.append(TelemetrySample(experiment_id=experiment_id, worker_id="test-host:w0",
                                           ts=1000.0 + 4 * trial.position + step, phase=phase, source="cpu",
                                           trial_id=trial.id, rss_bytes=(900 + step) * 2**20, cpu_percent=180.0,
                                           kv_bytes=step * 2**20))
        if load:
            for clients in LOAD_CLIENTS:
                level = load_level(trial.config_name, clients)
                if floor and trial.config_name == "baseline" and clients == max(LOAD_CLIENTS):
                    level = replace(level, noise_floor=[
                        Fidelity(tuple(2 * kl for kl in floor_of(item).kl), floor_of(item).agree,
                                 TEACHER_BASELINE_SAMPLE).to_dict() for item in range(8)])
                store.add_load_level(trial.id, "closed", float(clients), level.to_dict())
        if finish:
            store.finish_trial(trial.id, "done", worker_id="test-host:w0")
    store.add_telemetry(samples)
    return experiment_id

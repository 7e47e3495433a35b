"""The experiment page's Capacity section: what each of the experiment's configs buys on a GPU -- the sequences
of a context length that fit -- projected from its layout (:mod:`kvlab.capacity.projection`) beside the
compression the experiment measured.  Computed, never measured; every table and chart says so."""

from __future__ import annotations

import csv
import functools
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvlab.analysis.summary import ConfigSummary, stored_config
from kvlab.capacity.architectures import ARCHITECTURES, Architecture
from kvlab.capacity.architectures import architecture as find_architecture
from kvlab.capacity.gpus import GPUS
from kvlab.capacity.projection import ConfigCapacity, Pool, project
from kvlab.core.backends import BACKENDS
from kvlab.core.errors import ConfigError
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.units import GIB

DEFAULT_GPU = "h100-80gb"
DEFAULT_CONCURRENCY = 8
#: The context a projection opens on: the model's, capped here (the blog's example is 128K).
DEFAULT_CONTEXT_CAP = 131_072
MAX_CONTEXT = 10_000_000
LABEL = "Projection: computed from each config's layout, not measured"


@functools.lru_cache(maxsize=32)
def architecture(name: str) -> Architecture:
    """:func:`kvlab.capacity.architectures.architecture`, once per name in this process (a config's parameters are
    counted by building its model on the meta device: a second per rerun)."""
    return find_architecture(name)


@dataclass(frozen=True)
class CapacityChoice:
    """The section's inputs, as its share link carries them (None: the default)."""

    model: str
    gpu: str
    context: int
    concurrency: int


def model_choices(experiment_model: str) -> list[str]:
    """The experiment's own model first (where kvlab knows its geometry), then the built-in table."""
    try:
        architecture(experiment_model)
        own = [experiment_model]
    except (ConfigError, OSError, ValueError, ImportError):  # ImportError: transformers half-imported by another thread
        own = []
    return list(dict.fromkeys([*own, *ARCHITECTURES]))


def default_context(arch: Architecture) -> int:
    return min(arch.max_context or DEFAULT_CONTEXT_CAP, DEFAULT_CONTEXT_CAP)


def server_layout(backend_kind: str) -> tuple[int | None, int]:
    """A serving engine's pool layout: its block tokens (None for kvlab's own cache) and the tokens it sizes its
    whole pool in multiples of."""
    if not BACKENDS[backend_kind].launches_server:
        return None, 1
    from kvlab.engines.servers import serving_engine

    server = serving_engine(backend_kind)
    return server.pool_block_tokens, server.pool_granule_tokens


def capacity_rows(summaries: Sequence[ConfigSummary], backend_kind: str, choice: CapacityChoice
                  ) -> tuple[Pool, list[ConfigCapacity], list[dict[str, Any]]]:
    """The pool, each config's projection and the table's rows (every config, one that cannot be projected with
    its reason).  ``backend_kind`` picks the layout: a serving engine's pool or kvlab's cache."""
    return _rows([(s.config_name, stored_config(s.config), s.compression_ratio) for s in summaries], backend_kind,
                 choice, measured=True)


def planned_rows(configs: Sequence[KVCacheConfig], backend_kind: str, choice: CapacityChoice
                 ) -> tuple[Pool, list[dict[str, Any]]]:
    """The same projection for the configs of a spec not run yet (the new-experiment form): nothing measured."""
    pool, _, rows = _rows([(c.label, c, None) for c in configs], backend_kind, choice, measured=False)
    return pool, rows


def _rows(configs: Sequence[tuple[str, KVCacheConfig | None, float | None]], backend_kind: str,
          choice: CapacityChoice, *, measured: bool) -> tuple[Pool, list[ConfigCapacity], list[dict[str, Any]]]:
    """``configs``: each config's name, config (None: one this kvlab no longer reads) and measured compression
    ratio; ``measured``: whether the table has that column (not for a spec not run yet)."""
    arch = architecture(choice.model)
    pool = Pool.on_gpu(GPUS[choice.gpu].memory_bytes, arch)
    block, granule = server_layout(backend_kind)
    unread = "a config this kvlab no longer reads"
    projected = [project([config], arch, choice.context, pool, server_block=block, pool_granule=granule)[0] if config
                 else ConfigCapacity(name, problem=unread) for name, config, _ in configs]
    base = next((p.concurrency for p in projected if p.label == "baseline" and p.concurrency), None)
    rows = []
    for (name, _, ratio), row in zip(configs, projected, strict=True):
        rows.append({
            "config": name,
            **({"measured ratio (this experiment)": ratio} if measured else {}),
            "KV per sequence (GiB, projected)": None if row.sequence_bytes is None else row.sequence_bytes / GIB,
            "sequences that fit (projected)": row.concurrency,
            "vs baseline": row.concurrency / base if base and row.concurrency is not None else None,
            f"{choice.concurrency} fit?": None if row.concurrency is None else row.concurrency >= choice.concurrency,
            "note": row.problem or "",
        })
    return pool, projected, rows


def pool_text(pool: Pool, arch_title: str, choice: CapacityChoice) -> str:
    return (f"{LABEL}. {arch_title} on {GPUS[choice.gpu].title}, {choice.context:,} tokens per sequence: "
            f"KV pool {pool.bytes / GIB:,.1f} GiB ({pool.how}).")


def rows_csv(rows: Sequence[dict[str, Any]], label: str | None = LABEL) -> str:
    """A table of rows as CSV, its first line ``label`` where given (the projection's says it is one); text cells
    made inert for spreadsheets."""
    from kvlab.experiments.export import spreadsheet_safe

    buffer = io.StringIO()
    if label:
        buffer.write(f"# {label}\n")
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]) if rows else ["config"])
    writer.writeheader()
    for row in rows:
        writer.writerow({key: spreadsheet_safe(value) for key, value in row.items()})
    return buffer.getvalue()

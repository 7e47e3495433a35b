"""``kvlab capacity``: how many sequences of a context length each KV-cache config fits on a GPU -- a projection
(:mod:`kvlab.capacity.projection`), labelled so in every line it prints."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from kvlab.cli.options import float_between, positive_float, positive_int
from kvlab.core.backends import BACKENDS, server_kinds

if TYPE_CHECKING:
    from kvlab.capacity.projection import ConfigCapacity, Pool
    from kvlab.core.kv_config import KVCacheConfig

def layout_engines() -> tuple[str, ...]:
    """The layouts a projection follows: kvlab's cache or a serving engine's pool."""
    return ("embedded", *server_kinds())


def add_capacity_parser(subparsers: argparse._SubParsersAction) -> None:
    from kvlab.capacity.architectures import ARCHITECTURES
    from kvlab.capacity.gpus import GPUS
    from kvlab.capacity.projection import DEFAULT_OVERHEAD_GIB, DEFAULT_UTILIZATION, WEIGHT_BYTES

    capacity = subparsers.add_parser(
        "capacity", help="project how many sequences of a context length each KV-cache config fits on a GPU "
                         "(computed from each config's layout, not measured)")
    capacity.add_argument("--model", required=True,
                          help=f"a model of the built-in table ({', '.join(ARCHITECTURES)}), of kvlab's registry, "
                               "or a local config.json (or its directory)")
    where = capacity.add_mutually_exclusive_group(required=True)
    where.add_argument("--gpu", help=f"the GPU: {', '.join(GPUS)}, or 'this' (NVML)")
    where.add_argument("--memory-gib", type=positive_float, help="the GPU memory in GiB, for a GPU not in the table")
    where.add_argument("--pool-gib", type=positive_float,
                       help="the KV pool itself in GiB (a serving engine's start-up line), instead of an estimate")
    capacity.add_argument("--gpus", type=positive_int, default=1,
                          help="GPUs the model is split over (tensor parallel): their memory adds up (default: 1)")
    capacity.add_argument("--weights-dtype", choices=list(WEIGHT_BYTES), default="bfloat16",
                          help="the weights' dtype, for the memory they take (default: %(default)s)")
    capacity.add_argument("--utilization", type=float_between(0.0, 1.0, inclusive_low=False),
                          default=DEFAULT_UTILIZATION,
                          help="the share of GPU memory the engine takes (vLLM's --gpu-memory-utilization; "
                               "default: %(default)s)")
    capacity.add_argument("--overhead-gib", type=float_between(0.0, 4096.0), default=DEFAULT_OVERHEAD_GIB,
                          help="memory kept back for activations and the runtime (default: %(default)s)")
    capacity.add_argument("--context", type=positive_int,
                          help="tokens per sequence, prompt and output (default: the model's context)")
    capacity.add_argument("--concurrency", type=positive_int, default=1,
                          help="the sequences that must fit at once (default: %(default)s)")
    capacity.add_argument("--block-tokens", type=positive_int,
                          help="tokens per block of a serving engine's pool (default: the engine's on a GPU; "
                               "vLLM's CPU build uses 128)")
    capacity.add_argument("--engine", choices=layout_engines(), default=server_kinds()[0],
                          help="whose cache layout: kvlab's (embedded: quantization and eviction) or a serving "
                               "engine's pool (default: %(default)s)")
    configs = capacity.add_mutually_exclusive_group()
    configs.add_argument("--spec", help="project the configs of this spec file")
    configs.add_argument("--quant", action="append", metavar="FORMAT",
                         help="a format to project beside the baseline (repeat it; default: every format the "
                              "engine stores)")
    capacity.add_argument("--json", action="store_true", help="print JSON instead of a table")
    capacity.set_defaults(func=run_capacity)


def _configs(args: argparse.Namespace) -> list[KVCacheConfig]:
    from kvlab.core.kv_config import BASELINE, KVCacheConfig

    if args.spec:
        from kvlab.spec_files import load_spec

        return load_spec(args.spec)[0].all_configs()
    quants = args.quant or (["int8", "int4", "int2", "fp8_e4m3"] if args.engine == "embedded"
                            else list(BACKENDS[args.engine].kv_dtypes))
    return [BASELINE, *(KVCacheConfig(quant=q) for q in quants if q != "none")]


def _pool(args: argparse.Namespace, arch) -> Pool:
    from kvlab.capacity.gpus import gpu
    from kvlab.capacity.projection import Pool
    from kvlab.core.units import GIB

    if args.pool_gib is not None:
        return Pool(int(args.pool_gib * GIB), f"given: {args.pool_gib:g} GiB")
    memory = int(args.memory_gib * GIB) if args.memory_gib is not None else gpu(args.gpu).memory_bytes
    pool = Pool.on_gpu(memory * args.gpus, arch, args.weights_dtype, args.utilization, args.overhead_gib)
    return pool if args.gpus == 1 else Pool(pool.bytes, f"{args.gpus} GPUs, {pool.how}")


def run_capacity(args: argparse.Namespace) -> int:
    from kvlab.capacity.architectures import architecture
    from kvlab.capacity.projection import project
    from kvlab.cli.exits import UserError
    from kvlab.engines.servers import serving_engine

    arch = architecture(args.model)
    context = args.context or arch.max_context
    if not context:
        raise UserError(f"{args.model}: its config states no context length; give --context")
    pool = _pool(args, arch)
    if args.engine == "embedded" and args.block_tokens:
        raise UserError("--block-tokens is a serving engine's: kvlab's own cache (--engine embedded) has no blocks")
    block = None if args.engine == "embedded" else args.block_tokens or serving_engine(args.engine).pool_block_tokens
    granule = 1 if args.engine == "embedded" else serving_engine(args.engine).pool_granule_tokens
    rows = project(_configs(args), arch, context, pool, server_block=block, pool_granule=granule)
    if args.json:
        print(json.dumps(capacity_json(arch.name, context, args.concurrency, pool, rows), indent=2))
        return 0
    print("\n".join(capacity_lines(arch.title, context, args.concurrency, pool, rows)))
    return 0


def capacity_json(model: str, context: int, concurrency: int, pool: Pool, rows: list[ConfigCapacity]) -> dict:
    return {"projection": True, "model": model, "context_tokens": context, "concurrency": concurrency,
            "pool_bytes": pool.bytes, "pool": pool.how,
            "configs": [{"config": r.label, "sequence_bytes": r.sequence_bytes, "pool_tokens": r.pool_tokens,
                         "concurrency": r.concurrency, "sequences": r.sequences, "layout": r.layout,
                         "problem": r.problem} for r in rows]}


def capacity_lines(title: str, context: int, concurrency: int, pool: Pool, rows: list[ConfigCapacity]) -> list[str]:
    """The projection as a table, its pool and its layouts said above it."""
    from kvlab.core.units import GIB

    lines = [f"PROJECTION (computed, not measured): {title}, {context:,} tokens per sequence, "
             f"{concurrency} at once", f"KV pool {pool.bytes / GIB:,.2f} GiB ({pool.how})",
             f"{'config':32} {'KV per sequence':>16} {'pool tokens':>12} {'sequences':>10} {'vs baseline':>12}  "
             f"{concurrency} fit?"]
    base = next((r.concurrency for r in rows if r.label == "baseline" and r.concurrency), None)
    for row in rows:
        if row.problem:
            lines.append(f"{row.label:32} not projected: {row.problem}")
            continue
        assert row.sequence_bytes is not None and row.concurrency is not None
        tokens = f"{row.pool_tokens:,}" if row.pool_tokens is not None else "-"
        gain = f"{row.concurrency / base:.2f}x" if base else "-"
        fits = "yes" if row.concurrency >= concurrency else "no"
        lines.append(f"{row.label:32} {row.sequence_bytes / GIB:>12,.3f} GiB {tokens:>12} "
                     f"{row.concurrency:>10,.2f} {gain:>12}  {fits}")
    layouts = sorted({r.layout for r in rows if r.layout})
    return lines + [f"layout: {layout}" for layout in layouts]

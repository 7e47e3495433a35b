"""``kvlab models`` and ``kvlab methods``: the model registry and the compression registries, listed."""

from __future__ import annotations

import argparse
import sys

from kvlab.cli.options import VERBOSE_HELP


def cmd_models(args: argparse.Namespace) -> int:
    from kvlab.models import DEFAULT_MODEL, list_models, pull_model

    if args.action == "pull":
        if args.verbose:
            from kvlab.models.quiet import set_verbose

            set_verbose()
        path = pull_model(args.name, progress=lambda msg: print(msg, file=sys.stderr))
        print(path)
        return 0
    for status in list_models():
        mark = "pulled" if status.pulled else "not pulled"
        default = " (default)" if status.name == DEFAULT_MODEL else ""
        print(f"{status.name:16} {mark:11} {status.display_name}{default}")
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    """Every registered format and method, read from the registries (nothing imported heavily)."""
    from kvlab.core.backends import BACKENDS, server_kinds
    from kvlab.core.formats import FORMATS
    from kvlab.core.methods import BUDGETS, HEAD_BUDGETS, METHODS, PARAMS, REFUSED

    servers = [BACKENDS[kind] for kind in server_kinds()]
    print("quantization (quant): format, bits, stored as, scale groups, "
          f"{' / '.join(server.title for server in servers)} --kv-cache-dtype")
    for f in FORMATS.values():
        groups = f"group_size {'/'.join(map(str, f.group_sizes))}" if f.group_sizes else "-"
        aliases = f" (also: {', '.join(f.aliases)})" if f.aliases else ""
        dtypes = " / ".join(f"{server.title} {server.kv_dtypes.get(f.name, '-')}" for server in servers)
        print(f"  {f.name:10} {f.bits:2} bit  {f.storage_dtype:14} {groups:22} {dtypes}  {f.description}{aliases}")
    print("eviction (evict): exactly one budget per config")
    for budget, text in ((kind.name, kind.help) for kind in BUDGETS.values()):
        print(f"  {budget}: {text}")
    print("  parameters: " + "; ".join(f"{name} = {p.default} ({p.low}..{p.high}): {p.help}"
                                       for name, p in PARAMS.items()))
    for m in METHODS.values():
        checked = "checked on the default model" if m.checked_on_default_model else "NOT checked on the default model"
        params = f"; params {', '.join(m.params)}" if m.params else ""
        aliases = f"; also: {', '.join(m.aliases)}" if m.aliases else ""
        decodes = "scores during generation" if m.decodes else f"not during generation: {m.decode_refusal}"
        heads = "head-wise budgets" if m.headwise else f"no head-wise budget: {m.heads_refusal}"
        print(f"  {m.name:20} {m.description} ({m.paper})  [{', '.join(m.budgets)}; kvpress {m.press}{params}"
              f"{aliases}; {checked}; {decodes}; {heads}]")
    print("head budgets (heads; alpha_safeguard = 0.2, the least share of an equal split a head keeps):")
    for h in HEAD_BUDGETS.values():
        press = f"kvpress {h.press}, " if h.press else ""
        print(f"  {h.name:20} {h.description} ({press}{h.paper})")
    print("compression during generation (decode = {interval, target_tokens | ratio, buffer}): kvpress's "
          "DecodingPress, scored by the config's evict method; its prompt budget is then optional")
    print("kvpress scorer presses not offered:")
    for press, reason in REFUSED.items():
        print(f"  {press}: {reason}")
    return 0




def add_catalog_parsers(sub: argparse._SubParsersAction) -> None:
    models = sub.add_parser("models", help="list or pull models")
    models_sub = models.add_subparsers(dest="action", required=True)
    models_sub.add_parser("list", help="known models and whether they are pulled")
    pull = models_sub.add_parser("pull", help="fetch and convert a model once")
    pull.add_argument("name", help="a registry name (`kvlab models list`)")
    pull.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    models.set_defaults(func=cmd_models)
    methods = sub.add_parser("methods", help="list quantization formats and eviction methods")
    methods.set_defaults(func=cmd_methods)

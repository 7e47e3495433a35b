"""``kvlab serve``: command-line options -> a KV-cache config, the model, and uvicorn."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from kvlab.cli.options import float_between, int_between, positive_int
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import format_validation_error
from kvlab.core.formats import SETTINGS
from kvlab.core.kv_config import EVICTION_METHODS, MAX_DECODE_TOKENS, MAX_LAYERS, QUANT_DTYPES, KVCacheConfig
from kvlab.core.methods import BUDGETS, HEAD_BUDGET_NAMES, METHODS, PARAMS, BudgetKind

#: The KVCacheConfig fields kvlab serve takes as options: the format, its settings, the method, its
#: budget, its parameters (each from its registry) and how the budget is shared out across heads.
KV_FLAGS = ("quant", "value_quant", *SETTINGS, "evict", *BUDGETS, *PARAMS, "heads", "alpha_safeguard")
#: ``--decode-<field>``: the fields of a decode policy (compression during generation, by --evict's method).
DECODE_FLAGS: dict[str, tuple[Callable[[str], Any], str]] = {
    "interval": (int_between(1, MAX_DECODE_TOKENS), "compress the cache during generation every N passes"),
    "target_tokens": (int_between(1, MAX_DECODE_TOKENS), "... back to this many tokens"),
    "ratio": (float_between(0.0, 1.0, inclusive_low=False), "... or removing this fraction of all tokens seen"),
    "buffer": (int_between(0, MAX_DECODE_TOKENS), "hidden states of recent passes the scorer reads (default 256)"),
}


def _budget(kind: BudgetKind) -> Callable[[str], float]:
    """A parser of budget ``kind``: a number strictly between the registry's bounds (a whole one for a count)."""
    if kind.integer:
        return int_between(int(kind.low) + 1, int(kind.high) - 1)

    def parse(text: str) -> float:
        value = float_between(kind.low, kind.high, inclusive_low=False)(text)
        if value >= kind.high:
            raise argparse.ArgumentTypeError(f"must be a number in ({kind.low:g}, {kind.high:g}), got {text!r}")
        return value
    return parse


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="serve a model through an OpenAI-compatible API (with a KV-cache config)")
    serve.add_argument("--model", default="smollm2-135m", help="kvlab model name, local dir or .gguf")
    serve.add_argument("--served-model-name", help="the id clients send as `model` (default: --model)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    serve.add_argument("--port", type=int_between(1, 65535), default=8000)
    serve.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                       help="a Host name answered besides the address's own (repeatable); without an API key "
                            "only those names are answered, and with one too once this is given")
    serve.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    serve.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="default: float32 on CPU")
    serve.add_argument("--api-key-env", metavar="VAR",
                       help="require 'Authorization: Bearer <key>', the key read from this environment variable "
                            "or .streamlit/secrets.toml (never from the command line)")
    serve.add_argument("--threads", type=positive_int,
                       help="torch CPU threads (default: the cores this process may use)")
    serve.add_argument("--max-body-mb", type=float_between(0.0, 1024.0, inclusive_low=False), default=4.0,
                       help="refuse request bodies larger than this many MiB with a 413 (default: 4)")
    kv = serve.add_argument_group("KV cache (every request's default; a request may send its own `kv_cache`)")
    kv.add_argument("--quant", choices=QUANT_DTYPES, default="none",
                    help="the keys' and values' format (the keys' alone with --value-quant)")
    kv.add_argument("--value-quant", choices=QUANT_DTYPES, help="the values' format where it differs from the keys'")
    kv.add_argument("--skip-first", type=int_between(0, MAX_LAYERS), help="keep the first N layers 16-bit")
    kv.add_argument("--skip-last", type=int_between(0, MAX_LAYERS), help="keep the last N layers 16-bit")
    kv.add_argument("--skip-layers", type=int_between(0, MAX_LAYERS - 1), nargs="+", metavar="INDEX",
                    help="keep these layers 16-bit (vLLM's --kv-cache-dtype-skip-layers)")
    for setting in SETTINGS.values():  # used by the formats that read them (`kvlab methods`)
        kv.add_argument(f"--{setting.field.replace('_', '-')}", type=type(setting.default),
                        choices=setting.choices or None)
    kv.add_argument("--evict", choices=EVICTION_METHODS, default="none", help="see `kvlab methods`")
    for kind in BUDGETS.values():
        kv.add_argument(f"--{kind.name.replace('_', '-')}", type=_budget(kind),
                        metavar="TOKENS" if kind.integer else "FRACTION", help=kind.help)
    for name, param in PARAMS.items():
        kv.add_argument(f"--{name.replace('_', '-')}", type=int_between(param.low, param.high),
                        help=f"{param.help} (default {param.default})")
    kv.add_argument("--heads", choices=HEAD_BUDGET_NAMES,
                    help="share each layer's budget out across its KV heads (adakv, critical_adakv; default uniform)")
    kv.add_argument("--alpha-safeguard", type=float_between(0.0, 1.0),
                    help="with --heads: each head keeps at least this share of an equal split (default 0.2)")
    for name, (parse, help_text) in DECODE_FLAGS.items():
        kv.add_argument(f"--decode-{name.replace('_', '-')}", dest=f"decode_{name}", type=parse, help=help_text)
    serve.set_defaults(func=cmd_serve)


def kv_config_from_args(args: argparse.Namespace) -> KVCacheConfig:
    """The server's default config.  Eviction is query-aware by construction (the server sees the
    question), so it is marked so; a method that replays the context (KVzip) scores all but the last
    prompt token as the context."""
    values = {name: getattr(args, name) for name in KV_FLAGS if getattr(args, name) is not None}
    method = values.get("evict", "none")
    values["query_aware"] = method != "none" and not METHODS[method].replays_context
    decode = {name: value for name in DECODE_FLAGS if (value := getattr(args, f"decode_{name}")) is not None}
    if decode:
        values["decode"] = decode
    skip = {name: value for name, value in (("first", args.skip_first), ("last", args.skip_last),
                                            ("layers", args.skip_layers)) if value}
    if skip:
        values["skip_layers"] = skip
    try:
        return KVCacheConfig(**values)
    except ValidationError as error:  # one line per problem, each naming its option
        problems = format_validation_error(error).splitlines()
        raise ConfigError("KV-cache options: " + "; ".join(_as_flag(problem) for problem in problems)) from None


def _as_flag(problem: str) -> str:
    """``decode.target_tokens: ...`` as the option a user typed: ``--decode-target-tokens: ...``."""
    path, _, message = problem.partition(": ")
    if path == "spec":  # a check of the whole config: its message names the options
        return message
    return f"--{path.replace('.', '-').replace('_', '-')}: {message}"


def cmd_serve(args: argparse.Namespace) -> int:
    config = kv_config_from_args(args)  # refused before torch is imported (seconds on a laptop)
    from kvlab.engines.embedded import EmbeddedEngine
    from kvlab.models import load_model
    from kvlab.secrets import mask, read_setting
    from kvlab.serve import ServedModel, create_app
    from kvlab.serve.server import check_address, names_of, serve
    from kvlab.threads import set_torch_threads

    api_key = None
    if args.api_key_env:
        api_key, source = read_setting(args.api_key_env)
        if not api_key:
            raise ConfigError(f"--api-key-env {args.api_key_env}: no such variable in the environment or "
                              ".streamlit/secrets.toml")
        print(f"auth: on (key {mask(api_key)} from {source})", file=sys.stderr)
    elif args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: listening on {args.host} without an API key (--api-key-env)", file=sys.stderr)
    check_address(args.host, args.port)
    set_torch_threads(args.threads)
    engine = EmbeddedEngine(load_model(args.model, device=args.device, dtype=args.dtype))
    engine.check_configs([config])
    served = ServedModel(engine, args.served_model_name or args.model, config)
    print(f"serving {served.name} on http://{args.host}:{args.port}/v1 with KV cache {config.label}",
          file=sys.stderr, flush=True)
    # Without a key, only this address's names (DNS rebinding); with one, any name unless --allowed-host is given.
    allowed_hosts = names_of(args.host) | set(args.allowed_host) if args.allowed_host or not api_key else None
    serve(create_app(served, api_key, max_body_bytes=int(args.max_body_mb * 1024 * 1024),
                     allowed_hosts=allowed_hosts), served, args.host, args.port)
    return 0

"""``kvlab serve``: command-line options -> a KV-cache config, the model, and uvicorn."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from kvlab.cli.options import MAX_INT, float_between, int_between, positive_int
from kvlab.core.axes import LEAVES, Leaf, config_values, nested_model
from kvlab.core.errors import ConfigError
from kvlab.core.experiment_spec import format_validation_error
from kvlab.core.kv_config import KVCacheConfig
from kvlab.core.methods import METHODS


def _parser(leaf: Leaf) -> Callable[[str], Any]:
    """The ``type=`` of a KV option: a number within its field's bounds (strict ones kept strict)."""
    low, high = leaf.low, leaf.high
    if leaf.kind in ("int", "ints"):
        return int_between(int(low or 0) + leaf.low_open, int(high if high is not None else MAX_INT) - leaf.high_open)
    parse_low = float_between(low if low is not None else -math.inf, high if high is not None else math.inf,
                              inclusive_low=not leaf.low_open)

    def parse(text: str) -> float:
        value = parse_low(text)
        if leaf.high_open and high is not None and value >= high:
            raise argparse.ArgumentTypeError(f"must be a number in ({low:g}, {high:g}), got {text!r}")
        return value
    return parse


def _boolean(text: str) -> bool:
    """``true`` or ``false`` (a TOML spec's spelling), as an option's value."""
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"give true or false, got {text!r}")
    return text.lower() == "true"


def add_kv_options(group: argparse._ArgumentGroup) -> None:
    """One option per leaf of the axes table that ``kvlab serve`` takes (:data:`kvlab.core.axes.LEAVES`)."""
    for leaf in LEAVES:
        if leaf.flag is None:
            continue
        flag = "--" + leaf.flag.replace("_", "-")
        default = f" (default {leaf.default})" if leaf.default not in (None, (), "none") else ""
        if leaf.kind == "choice":
            group.add_argument(flag, dest=leaf.flag, choices=list(leaf.choices), type=type(leaf.choices[0]),
                               help=leaf.help + default)
        elif leaf.kind == "bool":
            group.add_argument(flag, dest=leaf.flag, type=_boolean, metavar="true|false", help=leaf.help)
        elif leaf.kind == "ints":
            group.add_argument(flag, dest=leaf.flag, type=_parser(leaf), nargs="+", metavar="INDEX", help=leaf.help)
        else:
            group.add_argument(flag, dest=leaf.flag, type=_parser(leaf), help=leaf.help + default,
                               metavar="N" if leaf.kind == "int" else "NUMBER")


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="serve a model through an OpenAI-compatible API (with a KV-cache config)")
    serve.add_argument("--model", default="smollm2-135m", help="kvlab model name, local dir or .gguf")
    serve.add_argument("--served-model-name", help="the id clients send as `model` (default: --model)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    serve.add_argument("--port", type=int_between(1, 65535), default=8000,
                       help="port to listen on (default: %(default)s)")
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
    add_kv_options(kv)
    serve.set_defaults(func=cmd_serve)


def kv_config_from_args(args: argparse.Namespace) -> KVCacheConfig:
    """The server's default config.  Eviction is query-aware by construction (the server sees the
    question), so it is marked so; a method that replays the context (KVzip) scores all but the last
    prompt token as the context."""
    values = config_values(vars(args))
    method = values.get("evict", "none")
    values["query_aware"] = method != "none" and not METHODS[method].replays_context
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
    field, _, inner = path.partition(".")
    flag = next((leaf.flag for leaf in LEAVES if leaf.flag is not None and leaf.axis.field == field
                 and (leaf.name == inner.partition(".")[0] if nested_model(leaf.axis) is not None else True)),
                path.replace(".", "_"))
    return f"--{flag.replace('_', '-')}: {message}"


def cmd_serve(args: argparse.Namespace) -> int:
    config = kv_config_from_args(args)  # refused before torch is imported (seconds on a laptop)
    from kvlab.engines.embedded_streaming import StreamingEngine
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
    engine = StreamingEngine(load_model(args.model, device=args.device, dtype=args.dtype))
    engine.check_configs([config])
    served = ServedModel(engine, args.served_model_name or args.model, config)
    print(f"serving {served.name} on http://{args.host}:{args.port}/v1 with KV cache {config.label}",
          file=sys.stderr, flush=True)
    # Without a key, only this address's names (DNS rebinding); with one, any name unless --allowed-host is given.
    allowed_hosts = names_of(args.host) | set(args.allowed_host) if args.allowed_host or not api_key else None
    serve(create_app(served, api_key, max_body_bytes=int(args.max_body_mb * 1024 * 1024),
                     allowed_hosts=allowed_hosts), served, args.host, args.port)
    return 0

"""Options several commands share, and argparse ``type=`` converters for numeric options: each refuses what
the option cannot mean.

argparse turns the ``ArgumentTypeError`` into ``error: argument --limit: must be a whole number
>= 1, got '0'`` and exit status 2.  Integers are capped at 2**63 - 1, the largest id or count a
database column holds (a larger one would reach the driver as an overflow, not a message).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

MAX_INT = 2**63 - 1
VERBOSE_HELP = "show the libraries' logs and per-file progress bars (also: KVLAB_VERBOSE=1)"


def _whole_number(text: str, minimum: int, maximum: int = MAX_INT) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        value = None
    if value is None or not minimum <= value <= maximum:
        allowed = f"in [{minimum}, {maximum}]" if maximum < MAX_INT else f">= {minimum}"
        raise argparse.ArgumentTypeError(f"must be a whole number {allowed}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """A count or id: 1, 2, ..."""
    return _whole_number(text, 1)


def non_negative_int(text: str) -> int:
    """A count where 0 means none."""
    return _whole_number(text, 0)


def int_between(low: int, high: int) -> Callable[[str], int]:
    """A converter for a whole number in [low, high]."""
    return lambda text: _whole_number(text, low, high)


def positive_float(text: str) -> float:
    """A finite number > 0 (seconds, rates): NaN and infinity are refused."""
    return float_between(0.0, math.inf, inclusive_low=False)(text)


def float_between(low: float, high: float, inclusive_low: bool = True) -> Callable[[str], float]:
    """A converter for a finite number in [low, high] (or (low, high] with ``inclusive_low=False``)."""
    if math.isfinite(high):
        shown = f"in {'[' if inclusive_low else '('}{low:g}, {high:g}]"
    else:
        shown = f">= {low:g}" if inclusive_low else f"> {low:g}"

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        above_low = value >= low if inclusive_low else value > low
        if not (math.isfinite(value) and above_low and value <= high):
            raise argparse.ArgumentTypeError(f"must be a number {shown}, got {text!r}")
        return value

    return convert


def add_executor_options(parser: argparse.ArgumentParser, local: str) -> None:
    """``--executor local|ray`` and ``--ray-address`` (``kvlab run``, ``kvlab tune``); ``local`` says
    what the local executor is."""
    parser.add_argument("--executor", choices=["local", "ray"], default="local",
                        help=f"local: {local} (default); ray: one worker per node of a Ray cluster (needs "
                             "`pip install 'kvlab[ray]'` and, on several nodes, a PostgreSQL KVLAB_DATABASE_URL)")
    parser.add_argument("--ray-address", metavar="ADDRESS",
                        help="with --executor ray: the cluster (auto, HOST:PORT or ray://HOST:10001; default: "
                             "RAY_ADDRESS, else a cluster on this machine, else a new local one)")


#: The sweet-spot rule's margins, as options of `kvlab run`, `kvlab tune` and `kvlab show`.
MARGIN_OPTIONS = ("max_drop", "max_kl", "min_agreement")


def add_margin_options(parser: argparse.ArgumentParser, whose: str = "the spec's") -> None:
    """``--max-drop``, ``--max-kl``, ``--min-agreement``; each defaults to ``whose`` value."""
    from kvlab.core.margins import DEFAULT_MAX_DROP, DEFAULT_MAX_KL

    parser.add_argument("--max-drop", type=float_between(0.0, 0.5, inclusive_low=False), metavar="FRACTION",
                        help="accuracy margin of the sweet spot: accuracy a config may lose against the baseline "
                             f"(default: {whose} max_drop, {DEFAULT_MAX_DROP})")
    parser.add_argument("--max-kl", type=float_between(0.0, 10.0), metavar="NATS",
                        help="fidelity margin: a config whose mean KL(baseline || config) per token is certified "
                             "below this is acceptable unless its accuracy is shown to drop by more than max_drop "
                             f"(0: off; default: {whose} max_kl, {DEFAULT_MAX_KL})")
    parser.add_argument("--min-agreement", type=float_between(0.0, 0.999), metavar="FRACTION",
                        help="fidelity margin: top-1 agreement with the baseline certified above this "
                             f"(0: off; default: {whose} min_agreement, 0)")


def margin_overrides(args: argparse.Namespace) -> dict[str, float]:
    """The margins given on the command line, by spec field."""
    return {name: value for name in MARGIN_OPTIONS if (value := getattr(args, name, None)) is not None}

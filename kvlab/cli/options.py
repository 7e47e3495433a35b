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


def float_between(low: float, high: float, inclusive_low: bool = True,
                  inclusive_high: bool = True) -> Callable[[str], float]:
    """A converter for a finite number in [low, high] (an end open with ``inclusive_low`` / ``inclusive_high``
    false)."""
    if math.isfinite(high):
        shown = f"in {'[' if inclusive_low else '('}{low:g}, {high:g}{']' if inclusive_high else ')'}"
    else:
        shown = f">= {low:g}" if inclusive_low else f"> {low:g}"

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        above_low = value >= low if inclusive_low else value > low
        below_high = value <= high if inclusive_high else value < high
        if not (math.isfinite(value) and above_low and below_high):
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


def add_margin_options(parser: argparse.ArgumentParser, whose: str = "the spec's") -> None:
    """The sweet-spot rule's margins as options of `kvlab run`, `kvlab tune` and `kvlab show`: ``--max-drop``,
    ``--max-kl``, ``--min-agreement`` (:data:`kvlab.core.margin_inputs.MARGIN_INPUTS`: the spec's bounds and
    help); each defaults to ``whose`` value."""
    from kvlab.core.margin_inputs import MARGIN_INPUTS

    for margin in MARGIN_INPUTS.values():
        said = f"{margin.help} (default: {whose} {margin.name}, {margin.default:g})"
        parser.add_argument(margin.flag, metavar=margin.metavar, help=said.replace("%", "%%"),  # argparse's format
                            type=float_between(margin.low, margin.high, inclusive_low=not margin.low_open,
                                               inclusive_high=not margin.high_open))


def margin_overrides(args: argparse.Namespace) -> dict[str, float]:
    """The margins given on the command line, by spec field."""
    from kvlab.core.margin_inputs import MARGIN_INPUTS

    return {name: value for name in MARGIN_INPUTS if (value := getattr(args, name, None)) is not None}

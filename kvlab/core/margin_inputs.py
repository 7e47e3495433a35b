"""The sweet-spot rule's margins, declared once: each margin's bounds, default and help, and the few words each
input adds (the form's heading, the command line's metavar, a step).  The spec's fields
(``ExperimentSpec.max_drop``, ``max_kl``, ``min_agreement``), ``kvlab run``/``tune``/``show``'s ``--max-drop``,
``--max-kl``, ``--min-agreement``, the new-experiment form's inputs and the experiment page's margin are derived
from :data:`MARGIN_INPUTS`, so a bound or a help text is stated once.

Pure data: no pydantic, so that the store commands' parsers (``kvlab ls``, ``compare``) stay light.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvlab.core.margins import DEFAULT_MAX_DROP, DEFAULT_MAX_KL

#: How a margin is shown and typed: three decimals (a finer margin decides nothing on these item counts).
MARGIN_FORMAT = "%.3f"
#: The finest value the form takes, which keeps a strict bound strict there (0 < max_drop: 0.001 at least).
RESOLUTION = 0.001


@dataclass(frozen=True)
class MarginInput:
    """One margin: its spec field ``name``, bounds (``low_open`` / ``high_open``: strict), default and help, the
    form's ``label`` and ``step``, the command line's ``metavar``."""

    name: str
    low: float
    high: float
    default: float
    help: str
    label: str
    metavar: str
    step: float
    low_open: bool = False
    high_open: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def bounds(self) -> dict[str, Any]:
        """The bounds as pydantic's ``Field`` keywords (``gt``/``ge``, ``lt``/``le``)."""
        return {"gt" if self.low_open else "ge": self.low, "lt" if self.high_open else "le": self.high}

    @property
    def form_low(self) -> float:
        """The least value a form's input takes (a strict bound one resolution inside)."""
        return round(self.low + RESOLUTION * self.low_open, 6)

    @property
    def form_high(self) -> float:
        return round(self.high - RESOLUTION * self.high_open, 6)


MARGIN_INPUTS: dict[str, MarginInput] = {m.name: m for m in (
    MarginInput(
        "max_drop", 0.0, 0.5, DEFAULT_MAX_DROP, low_open=True, label="Margin max_drop (accuracy, 0-1)",
        metavar="FRACTION", step=0.005,
        help="The sweet spot's accuracy margin: the accuracy a config may lose against the baseline, as a fraction "
             "of the items like the accuracy itself (0.05: 5 items in 100). On a task where fidelity decides, its "
             "accuracy must not be shown to drop by more than this; elsewhere a paired test (Holm-corrected across "
             "configs) must show it within this."),
    MarginInput(
        "max_kl", 0.0, 10.0, DEFAULT_MAX_KL, label="Max KL (nats; 0: off)", metavar="NATS", step=0.01,
        help="Fidelity margin, where fidelity is measured (the embedded engine): a config whose mean "
             "KL(baseline || config) per token, teacher-forced on the baseline's output, is certified below this "
             "many nats (the upper end of its 95% t interval over items, Holm-corrected across configs) is "
             "acceptable on a task unless its accuracy is shown to drop by more than max_drop. 0 turns it off: "
             "accuracy non-inferiority decides."),
    MarginInput(
        "min_agreement", 0.0, 1.0, 0.0, high_open=True, label="Min top-1 agreement (0: off)", metavar="FRACTION",
        step=0.01,
        help="Fidelity margin: a config must also have its agreement with the baseline's top-1 token (the mean over "
             "items of each item's share of tokens) certified above this (0.9 = 90%), on every task. 0 turns it "
             "off."),
)}

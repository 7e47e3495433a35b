"""The sweet-spot rule's margins as a user enters them, derived from one declaration: the spec's fields
(``ExperimentSpec.max_drop``, ``max_kl``, ``min_agreement``: bounds, default, description), plus the few
words each input adds (the form's heading, the command line's metavar, a step).  ``kvlab run``/``tune``/
``show``'s ``--max-drop``, ``--max-kl``, ``--min-agreement``, the new-experiment form's inputs and the experiment
page's margin read them here, so a bound or a help text is stated once."""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.core.axis import bounds, shape
from kvlab.core.experiment_spec import ExperimentSpec

#: How a margin is shown and typed: three decimals (a finer margin decides nothing on these item counts).
MARGIN_FORMAT = "%.3f"
#: The finest value the form takes, which keeps a strict bound strict there (0 < max_drop: 0.001 at least).
RESOLUTION = 0.001


@dataclass(frozen=True)
class MarginInput:
    """One margin: its spec field ``name``, the form's ``label``, the command line's ``metavar``, the form's
    ``step``, and the field's bounds (``low_open``/``high_open``: strict), default and help."""

    name: str
    label: str
    metavar: str
    step: float
    low: float
    high: float
    default: float
    help: str
    low_open: bool = False
    high_open: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def form_low(self) -> float:
        """The least value a form's input takes (a strict bound one resolution inside)."""
        return round(self.low + RESOLUTION * self.low_open, 6)

    @property
    def form_high(self) -> float:
        return round(self.high - RESOLUTION * self.high_open, 6)


def _margin(name: str, label: str, metavar: str, step: float) -> MarginInput:
    info = ExperimentSpec.model_fields[name]
    annotation, metadata = shape(info.annotation)
    return MarginInput(name, label, metavar, step, default=info.default, help=info.description or "",
                       **bounds([*metadata, *info.metadata]))


MARGIN_INPUTS: dict[str, MarginInput] = {m.name: m for m in (
    _margin("max_drop", "Margin max_drop (accuracy, 0-1)", "FRACTION", 0.005),
    _margin("max_kl", "Max KL (nats; 0: off)", "NATS", 0.01),
    _margin("min_agreement", "Min top-1 agreement (0: off)", "FRACTION", 0.01),
)}

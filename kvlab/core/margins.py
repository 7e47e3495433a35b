"""The margins of the sweet-spot rule, and the rule in words (the decision itself is
:mod:`kvlab.analysis.decision` and :mod:`kvlab.analysis.verdict`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_DROP = 0.05
#: Nats of mean KL(baseline || config) per generated token.  Measured on SmolLM2 with quick.toml's
#: 20 passkey items at 1-2K tokens (README, "Decisions with power"): the configs that keep the
#: baseline's accuracy lie well under it (int8 mean 3e-5, int4 0.014 with its 95% upper bound 0.027),
#: those that lose 50-100 points well over it (int2 0.37, H2O at 50% 0.39, the rest 1.4-2.8, every
#: lower bound above 0.2): 0.05 leaves room on both sides.
DEFAULT_MAX_KL = 0.05
RULE = ("most compressed config whose accuracy is non-inferior to the baseline's: the lower end of the paired "
        "95% interval of (config - baseline) is above -{margin}, Holm-corrected across {m} configs")
RULE_FIDELITY = (
    "most compressed config that, on every task, has its fidelity to the baseline certified ({fidelity}: one-sided "
    "t bounds over items at 2.5%, the ends of their 95% intervals, Holm-corrected across {m} configs) and its "
    "accuracy not shown to drop by more than {margin} (the paired 95% interval is not wholly below "
    "-{margin}); on a task without fidelity, accuracy non-inferiority decides")


@dataclass(frozen=True)
class Margins:
    """The margins of the sweet-spot rule.  0 turns a fidelity margin off (a value, not None, so
    that it survives TOML and JSON, which drop nulls); with both off, accuracy alone decides."""

    max_drop: float = DEFAULT_MAX_DROP
    max_kl: float = DEFAULT_MAX_KL
    min_agreement: float = 0.0

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> Margins:
        """The margins of a stored spec (its dict), each absent one at its default."""
        return cls(float(spec.get("max_drop", DEFAULT_MAX_DROP)), float(spec.get("max_kl", DEFAULT_MAX_KL)),
                   float(spec.get("min_agreement", 0.0)))

    @property
    def fidelity(self) -> bool:
        """Whether a fidelity margin is set."""
        return self.max_kl > 0 or self.min_agreement > 0

    def fidelity_words(self) -> str:
        parts = ([f"mean KL below {self.max_kl:g} nats per token"] if self.max_kl > 0 else []) + (
            [f"top-1 agreement above {self.min_agreement:.0%}"] if self.min_agreement > 0 else [])
        return " and ".join(parts)

    def rule(self, configs: int | str) -> str:
        """The rule in words, for ``configs`` configs compared."""
        margin = f"{self.max_drop:g}"  # a fraction, as accuracy and its intervals are
        if self.fidelity:
            return RULE_FIDELITY.format(fidelity=self.fidelity_words(), margin=margin, m=configs)
        return RULE.format(margin=margin, m=configs) + ", on every task"


#: Every margin at its default: the default argument of the functions that take margins (a frozen value).
DEFAULT_MARGINS = Margins()

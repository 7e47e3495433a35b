"""The engines' baselines against each other: how far a server's baseline is from the embedded engine's.

A server experiment keeps, with each baseline result, the continuation its baseline sampled at temperature 1 and
that baseline's log-probability of each token (``extra["fidelity_reference"]``:
:class:`~kvlab.engines.server_fidelity.Reference`).  Scoring the same tokens with the embedded engine's model
(float32 on a CPU, no KV compression) gives, per token, log p_server(y) - log p_embedded(y): the sampled estimate
of KL(p_server || p_embedded), the same estimator the server's configs were judged with.  Its mean over items is
the floor below which no KV setting can be told apart across the two engines (vLLM's bfloat16 serving against
kvlab's float32, say).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvlab.analysis.fidelity import FidelitySummary
from kvlab.core.results import ItemResult
from kvlab.engines.server_fidelity import Reference, fidelity

#: The key of a baseline result's reference.
REFERENCE_KEY = "fidelity_reference"


def references(results: Sequence[ItemResult]) -> list[Reference]:
    """The references an experiment's baseline results keep (none for an engine that samples none)."""
    return [Reference.from_dict(r.extra[REFERENCE_KEY]) for r in results
            if r.error is None and isinstance(r.extra.get(REFERENCE_KEY), dict)]


def baseline_kl_to_embedded(refs: Sequence[Reference], model: str) -> FidelitySummary | None:
    """KL(server's baseline || the embedded engine's) over ``refs``, the embedded model (``model``, float32, no
    compression) scoring each reference's prompt and continuation in one forward pass; None without references."""
    usable = [ref for ref in refs if ref.tokens]
    if not usable:
        return None
    import torch

    from kvlab.models import load_model

    loaded = load_model(model)
    fidelities = []
    with torch.inference_mode():
        for ref in usable:
            ids = torch.tensor([list(ref.prompt_ids + ref.tokens)], device=loaded.model.device)
            logits = loaded.model(ids).logits[0, len(ref.prompt_ids) - 1:-1].float()
            logprobs = torch.log_softmax(logits, dim=-1)
            tokens = torch.tensor(ref.tokens, device=logits.device)
            scored = logprobs.gather(1, tokens[:, None])[:, 0].tolist()
            fidelities.append(fidelity(ref, scored, logprobs.argmax(dim=-1).tolist()))
    return FidelitySummary.of(fidelities)

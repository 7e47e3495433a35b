"""``kvlab tune``: a constrained multi-objective search for the sweet spot, run through the store.

:mod:`.spec` (the ``[tune]`` table), :mod:`.judge` (which candidates stop, which get more items),
:mod:`.study` (Optuna: proposals and their storage), :mod:`.driver` (the rounds), :mod:`.recommend`
(the deployable answer), :mod:`.progress` (what the CLI and the tune page show).
"""

"""The statistics of a run, apart from running it: per-config summaries and the sweet spot (:mod:`.summary`),
the paired non-inferiority tests (:mod:`.decision`), fidelity against the baseline (:mod:`.fidelity`), the
verdict per task (:mod:`.verdict`) and two engines' agreement on one spec (:mod:`.agreement`).  Pure: no
engine, store or model: kvlab's core and its byte accounting alone."""

"""Tests of kvlab.analysis: summaries and the sweet spot, the paired tests, fidelity, verdicts, agreement."""

"""Tests of kvlab.experiments: the runner, workers, executors, telemetry, fidelity and the statistics."""

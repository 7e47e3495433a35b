"""Tests of kvlab.experiments: the runner, workers, executors, launcher and telemetry."""

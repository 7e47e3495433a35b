"""Tests of kvlab.tasks: the task generators, scorers, specs and the task registry."""

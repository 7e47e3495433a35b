"""Tests of kvlab.cli: the commands as a user runs them."""

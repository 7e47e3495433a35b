"""Tests of kvlab.serve: ``kvlab serve`` as a real process."""

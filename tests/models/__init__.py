"""Tests of kvlab.models: the registry, fetching, conversion, resolution and loading."""

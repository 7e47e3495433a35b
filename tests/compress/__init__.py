"""Tests of kvlab.compress: quantized caches, eviction, byte accounting and the format and method registries."""

"""Tests of kvlab.engines: the embedded engine, the launched and OpenAI-compatible backends, their servers."""

"""Tests of kvlab.tune: the tune's rules, its progress and whole `kvlab tune` studies."""

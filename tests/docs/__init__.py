"""Tests of the documentation site: it builds strictly, its reference is the code's, its tutorial runs."""

"""The bottom layer: spec and result types, and the pure registries they are built from.

Every other kvlab package imports from here; nothing here imports another kvlab package (not even
inside a function) or anything beyond the standard library, pydantic and tomli_w, so that a spec
validates instantly, free of torch, wherever it is read (``tests/test_no_import_cycle.py``).  What
needs this host -- reading spec files, a local model's context, a jsonl file's rows -- is
:mod:`kvlab.spec_files`.
"""

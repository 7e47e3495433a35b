"""What a KV-cache config buys in a deployment: how many sequences of a context length fit in a memory budget.

:mod:`.architectures` holds real model geometries (sliding-window and hybrid layers included), :mod:`.gpus` the
memory of well-known GPUs, :mod:`.projection` the arithmetic: per config the bytes of one sequence (the config's
layout: format, scales, residual window, kept fraction, windows) and how many fit in the pool a GPU leaves.  A
projection is computed, never measured, and every output says so.
"""

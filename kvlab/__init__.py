"""kvlab: a lab bench for KV-cache compression."""

__version__ = "0.1.0"

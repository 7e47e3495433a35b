"""vLLM's KV menu as the installed engine declares it: its cache dtypes and which attention backend stores each.

Read from the install's sources with :mod:`ast` (nothing is imported: importing vLLM takes seconds and torch), so
that what kvlab says runs where follows the vLLM a user has, not the one kvlab was written against:

- ``vllm/config/cache.py``: ``CacheDType = Literal[...]``, every value ``--kv-cache-dtype`` takes;
- ``vllm/v1/attention/backends/**.py``: each attention backend class's ``supported_kv_cache_dtypes`` list and the
  name its ``get_name()`` returns (``CPU_ATTN``, ``TURBOQUANT``, ``FLASHINFER`` ...).  A backend under ``mla/``
  serves multi-head latent attention models (DeepSeek's) only.

The CPU build runs ``CPU_ATTN`` alone; a dtype no backend lists runs on an out-of-tree platform (Intel Gaudi's
``fp8_inc``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

#: The backend vLLM's CPU build attends with (``vllm/v1/attention/backends/cpu_attn.py``).
CPU_BACKEND = "CPU_ATTN"
CACHE_CONFIG = Path("config") / "cache.py"
BACKENDS_DIR = Path("v1") / "attention" / "backends"


@dataclass(frozen=True)
class AttentionBackend:
    name: str
    dtypes: tuple[str, ...]
    mla: bool  # a multi-head latent attention backend (DeepSeek-style models only)

    @property
    def shown(self) -> str:
        return f"{self.name} (MLA models)" if self.mla else self.name


@dataclass(frozen=True)
class KVMenu:
    """The dtypes an install takes and the attention backends that store each."""

    dtypes: tuple[str, ...]
    backends: tuple[AttentionBackend, ...]

    def stored_by(self, dtype: str) -> list[AttentionBackend]:
        return [backend for backend in self.backends if dtype in backend.dtypes]

    def cpu_dtypes(self) -> tuple[str, ...]:
        return next((b.dtypes for b in self.backends if b.name == CPU_BACKEND), ())

    def where(self, dtype: str) -> str:
        """Where ``dtype`` runs, in words: its backends, or that none of this install lists it."""
        backends = [b for b in self.stored_by(dtype) if b.name != CPU_BACKEND]
        if not backends:
            return "no attention backend of this install stores it (an out-of-tree platform's)"
        return f"it runs on the {', '.join(b.shown for b in backends)} attention backend(s) of a GPU build"


def read_menu(package_dir: str | None) -> KVMenu | None:
    """The menu of the vLLM package in ``package_dir`` (None where its sources do not say it)."""
    return _read(package_dir) if package_dir else None


@cache
def _read(package_dir: str) -> KVMenu | None:
    root = Path(package_dir)
    try:
        dtypes = _cache_dtypes(ast.parse((root / CACHE_CONFIG).read_text()))
        backends = tuple(backend for path in sorted((root / BACKENDS_DIR).rglob("*.py"))
                         for backend in _backends(ast.parse(path.read_text()), "mla" in path.parts))
    except (OSError, SyntaxError, ValueError):
        return None
    return KVMenu(dtypes, backends) if dtypes else None


def _cache_dtypes(tree: ast.Module) -> tuple[str, ...]:
    for node in tree.body:
        if _assigned(node) == "CacheDType":
            assert isinstance(node, ast.AnnAssign | ast.Assign)
            if isinstance(node.value, ast.Subscript):
                return tuple(_strings(node.value.slice))
    return ()


def _assigned(node: ast.stmt) -> str | None:
    """The name a statement assigns a value to (``X = ...``, ``X: T = ...``), if it is one."""
    if isinstance(node, ast.AnnAssign) and node.value is not None and isinstance(node.target, ast.Name):
        return node.target.id
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    return None


def _backends(tree: ast.Module, mla: bool) -> Iterator[AttentionBackend]:
    for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
        dtypes: list[str] = []
        name = None
        for node in cls.body:
            if _assigned(node) == "supported_kv_cache_dtypes":
                assert isinstance(node, ast.AnnAssign | ast.Assign) and node.value is not None
                dtypes = list(_strings(node.value))
            if isinstance(node, ast.FunctionDef) and node.name == "get_name":
                name = next((ret.value.value for ret in ast.walk(node) if isinstance(ret, ast.Return)
                             and isinstance(ret.value, ast.Constant) and isinstance(ret.value.value, str)), None)
        if dtypes:
            yield AttentionBackend(name or cls.name, tuple(dtypes), mla)


def _strings(node: ast.expr) -> Iterator[str]:
    elements = node.elts if isinstance(node, ast.Tuple | ast.List) else [node]
    for element in elements:
        if isinstance(element, ast.Constant) and isinstance(element.value, str):
            yield element.value

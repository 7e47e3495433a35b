"""Every path and folder kvlab uses, in one place.

Two roots: the checkout (``REPO_ROOT``: the default store, migrations, data files and examples
live in it) and ``$KVLAB_HOME`` (default ``~/.cache/kvlab``: models, logs and the servers' venvs,
shared by every checkout of one user).  Every log -- workers', detached tunes', Ray drivers', launched servers'
and the error logs of the CLI, the dashboard and ``kvlab serve`` -- goes under :func:`log_dir`.

Pure paths: nothing here creates a folder; the caller that writes does.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DB_DIR = REPO_ROOT / "db"
DEFAULT_SQLITE_PATH = DB_DIR / "kvlab.sqlite"
MIGRATIONS_DIR = DB_DIR / "migrations"
DEFAULT_DATA_DIR = DB_DIR / "data"
EXAMPLES_DIR = REPO_ROOT / "examples"
STATIC_DIR = REPO_ROOT / "static"

HOME_VAR = "KVLAB_HOME"
LOG_DIR_VAR = "KVLAB_LOG_DIR"
DATA_DIR_VAR = "KVLAB_DATA_DIR"


def kvlab_home() -> Path:
    """``$KVLAB_HOME``, by default ``~/.cache/kvlab``."""
    return Path(os.environ.get(HOME_VAR) or Path.home() / ".cache" / "kvlab").expanduser()


def models_root() -> Path:
    return kvlab_home() / "models"


def data_dir() -> Path:
    """The data directory (``$KVLAB_DATA_DIR``, else ``db/data``), absolute and with symlinks resolved
    (it need not exist yet)."""
    text = os.environ.get(DATA_DIR_VAR, "").strip()
    return (Path(text).expanduser() if text else DEFAULT_DATA_DIR).resolve()


def engine_venv(kind: str) -> Path:
    """The venv where ``scripts/install_{kind}.sh`` installs a server kvlab launches (``vllm``): its own,
    since the engine pins its own torch and transformers."""
    return kvlab_home() / "engines" / kind


def log_dir() -> Path:
    """Where every kvlab log goes: ``$KVLAB_LOG_DIR``, else ``$KVLAB_HOME/logs``."""
    return Path(os.environ.get(LOG_DIR_VAR) or kvlab_home() / "logs").expanduser()


def server_log_dir() -> Path:
    """Launched vLLM/SGLang servers' logs (one file per launch)."""
    return log_dir() / "servers"

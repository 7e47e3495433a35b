#!/usr/bin/env bash
# Set everything up and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --dev
. .venv/bin/activate
python -m pytest -q "$@"

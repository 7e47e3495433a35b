#!/usr/bin/env bash
# Set everything up and run the whole test suite (the README's test command; CI runs it too).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --dev
. .venv/bin/activate
# A throwaway PostgreSQL for the store tests (installs it with apt when missing, needs root then);
# without it those cases skip and say why.
if pg_env=$(bash scripts/postgres.sh); then
  eval "$pg_env"
else
  echo "test.sh: no PostgreSQL server; PostgreSQL cases will skip" >&2
fi
python -m pytest -q "$@"

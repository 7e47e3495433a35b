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
# Debian's chromium renders chart exports (kaleido) and runs the browser tests (Playwright); neither
# downloads a browser. Installed with apt when missing (needs root); without it those tests skip and say why.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >&2 \
      || echo "test.sh: could not install chromium; export and browser tests will skip" >&2
  else
    echo "test.sh: no chromium (apt-get install chromium); export and browser tests will skip" >&2
  fi
fi
python -m pytest -q "$@"

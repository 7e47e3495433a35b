#!/usr/bin/env bash
# Set everything up and run the whole test suite (the README's test command; CI runs it too).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --dev
. .venv/bin/activate
# Everything below is required: a test that would skip for want of it fails instead (KVLAB_STRICT_TESTS).
export KVLAB_STRICT_TESTS=1
step() { echo "test.sh: $*" >&2; }
# The second model, for the sliding-window tests.
step "the second model (gemma3-270m)"
kvlab models pull gemma3-270m >/dev/null
step "a throwaway PostgreSQL"
# A throwaway PostgreSQL for the store tests (installs it with apt when missing, needs root then).
pg_env=$(bash scripts/postgres.sh) || { echo "test.sh: could not start PostgreSQL (scripts/postgres.sh)" >&2; exit 1; }
eval "$pg_env"
# Debian's chromium renders chart exports (kaleido) and runs the browser tests (Playwright); neither
# downloads a browser. Installed with apt when missing (needs root).
if ! command -v chromium >/dev/null 2>&1; then
  echo "test.sh: installing chromium" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
    || { echo "test.sh: could not install chromium (apt-get install chromium)" >&2; exit 1; }
fi
# A real vLLM (its CPU build here, in its own venv): tests/engines/test_vllm_real.py runs kvlab's vLLM
# backend against it. About 2.5 min and 2.5 GB the first time; a later run finds it installed.
step "a real vLLM (scripts/install_vllm.sh)"
bash scripts/install_vllm.sh
step "the tests"
python -m pytest -q "$@"

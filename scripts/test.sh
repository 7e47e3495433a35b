#!/usr/bin/env bash
# Set everything up and run the tests (the README's test command; CI runs it too).
#   scripts/test.sh           # the whole suite: mypy, real model, PostgreSQL, chromium, a real vLLM
#   scripts/test.sh --fast    # ruff, mypy and the unit tests: no model, engine, browser or database server
#   scripts/test.sh [--fast] -- PYTEST_ARGS...
# One line per step. What it starts (PostgreSQL) it stops when it exits: on success, failure and Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
if [ "${1:-}" = "--fast" ]; then fast=1; shift; fi
[ "${1:-}" = "--" ] && shift
step() { echo "test.sh: $*" >&2; }
started=$SECONDS

step "kvlab and its test tools (scripts/setup.sh --dev)"
scripts/setup.sh --dev
. .venv/bin/activate
step "the linter (ruff check, configured in pyproject.toml)"
ruff check --quiet .

if [ "$fast" = 1 ]; then
  # The type checker runs beside the unit tests (a cold check takes about a minute on 2 cores, a warm
  # one seconds); its verdict is read once they end.
  mypy_log="${TMPDIR:-/tmp}/kvlab-test-mypy.log"
  step "the type checker (mypy on kvlab/, pages/ and app.py, beside the tests; its output in $mypy_log)"
  mypy --no-error-summary >"$mypy_log" 2>&1 &
  mypy_pid=$!
  trap 'kill "$mypy_pid" 2>/dev/null || true' EXIT
  # What needs a model, an engine, a browser or a database server is left to the whole suite; the
  # markers are set in tests/conftest.py (a test that uses the model's fixtures is a `model` test).
  step "the fast tier (pytest -m 'not model and not e2e and not server')"
  status=0
  python -m pytest -q -m "not model and not e2e and not server" "$@" || status=$?
  if ! wait "$mypy_pid"; then
    echo "test.sh: mypy found errors:" >&2
    cat "$mypy_log" >&2
    status=1
  fi
  step "done in $((SECONDS - started)) s"
  exit "$status"
fi

# Everything below is required: a test that would skip for want of it fails instead (KVLAB_STRICT_TESTS).
export KVLAB_STRICT_TESTS=1
step "the type checker (mypy on kvlab/, pages/ and app.py, configured in pyproject.toml)"
mypy --no-error-summary
pull_log="${TMPDIR:-/tmp}/kvlab-test-pull.log"
step "the second model (gemma3-270m; its progress in $pull_log)"
kvlab models pull gemma3-270m >"$pull_log" 2>&1 || { echo "test.sh: could not pull gemma3-270m:" >&2; tail -n 5 "$pull_log" >&2; exit 1; }

pg_log="${TMPDIR:-/tmp}/kvlab-test-postgres.log"
step "a throwaway PostgreSQL (its output in $pg_log)"
# Started here only if it is not already up; then stopped when this script exits, however it exits.
pg_was_up=0
bash scripts/postgres.sh status >/dev/null 2>&1 && pg_was_up=1
pg_env=$(bash scripts/postgres.sh 2>"$pg_log") || { echo "test.sh: could not start PostgreSQL:" >&2; tail -n 5 "$pg_log" >&2; exit 1; }
if [ "$pg_was_up" = 0 ]; then
  trap 'bash scripts/postgres.sh stop >>"$pg_log" 2>&1 || true' EXIT
  trap 'exit 130' INT TERM  # the EXIT trap then stops it
fi
eval "$pg_env"

# Debian's chromium renders chart exports (kaleido) and runs the browser tests (Playwright); neither
# downloads a browser. Installed with apt when missing (needs root).
if ! command -v chromium >/dev/null 2>&1; then
  step "chromium (apt-get)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
    || { echo "test.sh: could not install chromium (apt-get install chromium)" >&2; exit 1; }
fi
# A real vLLM (its CPU build here, in its own venv): tests/engines/test_vllm_real.py runs kvlab's vLLM
# backend against it. About 2.5 min and 2.5 GB the first time; a later run finds it installed.
step "a real vLLM (scripts/install_vllm.sh)"
bash scripts/install_vllm.sh
# A real llama.cpp (llama-cpp-python's server on the llama.cpp it vendors, built for this host in its own venv):
# tests/engines/test_llamacpp_real.py. Built once (minutes of compiling); a later run finds it built.
step "a real llama.cpp (scripts/install_llamacpp.sh)"
bash scripts/install_llamacpp.sh
step "what this host's engines run (kvlab engines)"
kvlab engines >&2
step "the tests"
status=0
python -m pytest -q --durations=25 "$@" || status=$?
step "done in $((SECONDS - started)) s"
exit "$status"

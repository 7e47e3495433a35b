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
logs="${TMPDIR:-/tmp}"
# The preparations do not depend on each other: the type checker, the second model, a real vLLM and a real
# llama.cpp run side by side (the first time, building llama.cpp is the longest: minutes of compiling).
#   mypy on kvlab/, pages/ and app.py (configured in pyproject.toml)
#   the second model (gemma3-270m)
#   a real vLLM, its CPU build in its own venv (scripts/install_vllm.sh): tests/engines/test_vllm_real.py runs
#     kvlab's vLLM backend against it; about 2.5 min and 2.5 GB the first time
#   a real llama.cpp (scripts/install_llamacpp.sh): llama-cpp-python's server on the llama.cpp it vendors, built
#     for this host in its own venv, and its C++ llama-server; tests/engines/test_llamacpp_real.py
# A later run finds each installed in seconds.  Each one's output goes to its log; a failure shows its tail.
declare -A preparing=()
prepare() {  # NAME COMMAND...: start COMMAND in the background, its output in $logs/kvlab-test-NAME.log
  local name=$1; shift
  "$@" >"$logs/kvlab-test-$name.log" 2>&1 &
  preparing[$name]=$!
}
step "side by side (their logs in $logs/kvlab-test-*.log): mypy, gemma3-270m, a real vLLM, a real llama.cpp"
prepare mypy mypy --no-error-summary
prepare gemma3-270m kvlab models pull gemma3-270m
prepare vllm bash scripts/install_vllm.sh
prepare llamacpp bash scripts/install_llamacpp.sh
trap 'kill "${preparing[@]}" 2>/dev/null || true' EXIT

pg_log="$logs/kvlab-test-postgres.log"
step "a throwaway PostgreSQL (its output in $pg_log)"
# Started here only if it is not already up; then stopped when this script exits, however it exits.
pg_was_up=0
bash scripts/postgres.sh status >/dev/null 2>&1 && pg_was_up=1
pg_env=$(bash scripts/postgres.sh 2>"$pg_log") || { echo "test.sh: could not start PostgreSQL:" >&2; tail -n 5 "$pg_log" >&2; exit 1; }
stop_pg() { [ "$pg_was_up" = 1 ] || bash scripts/postgres.sh stop >>"$pg_log" 2>&1 || true; }
trap 'kill "${preparing[@]}" 2>/dev/null || true; stop_pg' EXIT
trap 'exit 130' INT TERM  # the EXIT trap then stops what was started
eval "$pg_env"

# Debian's chromium renders chart exports (kaleido) and runs the browser tests (Playwright); neither
# downloads a browser. Installed with apt when missing (needs root).
if ! command -v chromium >/dev/null 2>&1; then
  step "chromium (apt-get)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
    || { echo "test.sh: could not install chromium (apt-get install chromium)" >&2; exit 1; }
fi
for name in mypy gemma3-270m vllm llamacpp; do
  if wait "${preparing[$name]}"; then
    step "$name: ready ($((SECONDS - started)) s since the start)"
  else
    echo "test.sh: $name failed (its log: $logs/kvlab-test-$name.log):" >&2
    tail -n 20 "$logs/kvlab-test-$name.log" >&2
    exit 1
  fi
done
step "what this host's engines run (kvlab engines)"
kvlab engines >&2
# Two pytest-xdist workers, each taking whole files (a file's module fixtures, a started server or a sweep, serve
# all its tests): much of the suite waits on a server, a browser or a child process, and the other worker runs
# meanwhile.  KVLAB_TEST_WORKERS=1 runs the files one after another in this process.
workers="${KVLAB_TEST_WORKERS:-2}"
step "the tests ($workers worker(s))"
status=0
if [ "$workers" -gt 1 ]; then set -- -n "$workers" --dist loadfile "$@"; fi
python -m pytest -q --durations=25 "$@" || status=$?
step "done in $((SECONDS - started)) s"
exit "$status"

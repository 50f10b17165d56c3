#!/usr/bin/env bash
# The checks behind `make test` (and `make lint`, `make upstream-tests`,
# `make project-tests`, `make e2e`). Runs every stage, prints a summary, exits
# non-zero if any stage failed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TREE=$ROOT/build/vllm
PY=$ROOT/.venv/bin/python
source tools/testenv.sh || exit 1

declare -a RESULTS=()
status=0
record() {  # name rc
  if [ "$2" -eq 0 ]; then RESULTS+=("PASS  $1"); else RESULTS+=("FAIL  $1"); status=1; fi
}

stage_series() {
  echo "=== every patch applies in order to the pristine base"
  "$PY" tools/ws.py check-series
}

stage_each() {
  echo "=== each patch on its own: its lint and the tests it touches (bisectable)"
  "$PY" tools/ws.py check-each
}

stage_lint() {
  echo "=== vLLM's ruff check, ruff format --check and mypy on the files the series touches"
  "$PY" tools/ws.py lint
}

stage_upstream_tests() {
  echo "=== vLLM's own suites in the patched tree (testenv/upstream-suites.txt)"
  mapfile -t deselect < <("$PY" tools/deselected.py --args)
  local logs pids=() groups rc=0
  logs=$(mktemp -d)
  groups=$(grep -v '^\s*#' testenv/upstream-suites.txt | awk 'NF {print $1}' | sort -u)
  for g in $groups; do
    mapfile -t suites < <(grep -v '^\s*#' testenv/upstream-suites.txt | awk -v g="$g" '$1 == g {print $2}')
    (cd "$TREE" && "$PY" -m pytest -p no:cacheprovider -q -rfE --timeout=900 \
       "${deselect[@]}" "${suites[@]}") >"$logs/$g.log" 2>&1 &
    pids+=("$!")
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  for g in $groups; do
    echo "--- group $g: $(grep -v '^\s*#' testenv/upstream-suites.txt | awk -v g="$g" '$1 == g {printf "%s ", $2}')"
    cat "$logs/$g.log"
  done
  rm -rf "$logs"
  return $rc
}

stage_project_tests() {
  echo "=== the project's own tests (tests/)"
  "$PY" -m pytest -p no:cacheprovider -q -rfE tests
}

stage_e2e() {
  echo "=== end to end: a real vLLM engine at TP 2 on the CPU platform (e2e/)"
  "$PY" e2e/run.py
}

run_stage() {  # name function
  "$2"; record "$1" $?
}

case "${1:-all}" in
  lint) run_stage lint stage_lint ;;
  check-each) run_stage "each patch on its own" stage_each ;;
  upstream-tests) run_stage "vLLM suites" stage_upstream_tests ;;
  project-tests) run_stage "project tests" stage_project_tests ;;
  e2e) run_stage "end to end" stage_e2e ;;
  all)
    run_stage "series applies" stage_series
    run_stage lint stage_lint
    run_stage "each patch on its own" stage_each
    run_stage "vLLM suites" stage_upstream_tests
    run_stage "project tests" stage_project_tests
    run_stage "end to end" stage_e2e
    ;;
  *) echo "usage: $0 [all|lint|check-each|upstream-tests|project-tests|e2e]" >&2; exit 2 ;;
esac

echo "=== summary"
printf '%s\n' "${RESULTS[@]}"
exit $status

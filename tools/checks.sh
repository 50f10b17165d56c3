#!/usr/bin/env bash
# The checks behind `make test` (and `make lint`, `make check-each`,
# `make upstream-tests`, `make project-tests`, `make e2e`). Runs every stage,
# for every base of bases/ (or the one named by BASE), prints a summary, and
# exits non-zero if any stage failed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
mapfile -t ALL_BASES < <(ls bases | sort -V)
if [ -n "${BASE:-}" ]; then BASES=("$BASE"); else BASES=("${ALL_BASES[@]}"); fi
# The project's own tests and the real engine run once, in the seed's base
# (the first): the tests start each base's own Python where they need it.
FIRST=${ALL_BASES[0]}
BASE=$FIRST
source tools/testenv.sh || exit 1
WS=(python3 tools/ws.py)

declare -a RESULTS=()
status=0
record() {  # name rc seconds
  if [ "$2" -eq 0 ]; then RESULTS+=("PASS  $1 ($3 s)"); else RESULTS+=("FAIL  $1 ($3 s)"); status=1; fi
}

stage_series() {  # base
  echo "=== $1: every patch applies in order to the pristine base"
  "${WS[@]}" --base "$1" check-series
}

stage_each() {  # base [--leave-to-suites]
  echo "=== $1: each patch on its own: its lint and the tests it touches (bisectable)"
  "${WS[@]}" --base "$1" check-each "${@:2}"
}

# `make test` runs the suites next: check-each leaves them the test files of
# the patches after which the tree's Python no longer changes.
stage_each_before_suites() {  # base
  stage_each "$1" --leave-to-suites
}

stage_lint() {  # base
  echo "=== $1: vLLM's ruff check, ruff format --check and mypy on the files the series touches"
  "${WS[@]}" --base "$1" lint
}

stage_upstream_tests() {  # base
  local base=$1 suites_file=bases/$1/upstream-suites.txt
  local tree=$ROOT/build/vllm-$1 py=$ROOT/.venv-$1/bin/python
  echo "=== $base: vLLM's own suites in the patched tree ($suites_file)"
  mapfile -t deselect < <(python3 tools/deselected.py "$base" --args)
  local logs pids=() groups g paths suites rc=0
  # One line per group: the group, then its test paths.
  groups=$("${WS[@]}" --base "$base" suites) || return 1
  logs=$(mktemp -d)
  while read -r g paths; do
    read -ra suites <<<"$paths"
    (cd "$tree" && eval "$(python3 "$ROOT/tools/ws.py" --base "$base" test-env)" &&
       PYTHONPATH=$ROOT/tools "$py" -m pytest -p no:cacheprovider \
       -p checks_last_test -q -rfE --timeout=900 \
       "${deselect[@]}" "${suites[@]}") >"$logs/$g.log" 2>&1 &
    pids+=("$!")
  done <<<"$groups"
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  while read -r g paths; do
    echo "--- group $g: $paths"
    cat "$logs/$g.log"
  done <<<"$groups"
  rm -rf "$logs"
  return $rc
}

stage_project_tests() {
  echo "=== the project's own tests (tests/)"
  # Two at once, as the suites: the wheels' build and install (mostly disk)
  # beside the rest (mostly CPU).
  local logs rc=0 pids=()
  logs=$(mktemp -d)
  "$ROOT/.venv-$FIRST/bin/python" -m pytest -p no:cacheprovider -q -rfE \
    tests/test_wheel.py >"$logs/wheel.log" 2>&1 &
  pids+=("$!")
  "$ROOT/.venv-$FIRST/bin/python" -m pytest -p no:cacheprovider -q -rfE \
    --ignore=tests/test_wheel.py tests >"$logs/rest.log" 2>&1 &
  pids+=("$!")
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  echo "--- tests/test_wheel.py"; cat "$logs/wheel.log"
  echo "--- the other tests"; cat "$logs/rest.log"
  rm -rf "$logs"
  return $rc
}

stage_e2e() {
  echo "=== end to end: a real vLLM $FIRST engine at TP 2 on the CPU platform (e2e/)"
  "$ROOT/.venv-$FIRST/bin/python" e2e/run.py
}

# Each stage runs under a wall-clock limit of its own, in seconds: about
# twice what it takes on a fresh clone on a machine of this kind busy with
# another 2-core job (there, 0.34.0's each-patch stage took 20 min and its
# suites over 30, against 6 and 10 on a quiet one; docs/testing.md). What stops a
# hang early is the idle limit below; the wall-clock limit is the backstop.
# CHECKS_LIMIT=<seconds> sets every stage's limit.
stage_limit() {  # function
  if [ -n "${CHECKS_LIMIT:-}" ]; then echo "$CHECKS_LIMIT"; return; fi
  case $1 in
    stage_series) echo 300 ;;
    stage_lint) echo 1800 ;;
    stage_each | stage_each_before_suites) echo 3600 ;;
    stage_upstream_tests) echo 3600 ;;
    stage_project_tests) echo 3600 ;;
    stage_e2e) echo 900 ;;
    *) echo 3600 ;;
  esac
}

# A stage whose tests have run, and where no test has then started or ended
# for this many seconds, has hung (a process that never exits, such as a
# failed test's children left waiting): it is stopped then, well before its
# wall-clock limit and CI's 90 minutes. pytest's own --timeout (900 s) stops
# a single test first. CHECKS_IDLE_LIMIT=<seconds> sets it.
idle_limit() {
  echo "${CHECKS_IDLE_LIMIT:-900}"
}

# KV offload regions (/dev/shm/vllm_offload_*) that are not in $1 (those
# there before the stage) and that no process maps or holds open: left by a
# test that did not clean up after itself.
left_regions() {  # regions-before
  local f
  for f in /dev/shm/vllm_offload_*; do
    [ -e "$f" ] || continue
    grep -qxF -- "$f" <<<"$1" && continue
    grep -qsF -- "$f" /proc/[0-9]*/maps && continue
    [ -n "$(find /proc/[0-9]*/fd -lname "$f" -print -quit 2>/dev/null)" ] && continue
    echo "$f"
  done
}

# A stage is this script again (`--stage`), in a process group of its own
# under timeout(1), which on expiry signals the whole group: every process
# the stage started (pytest's children included), then SIGKILL 20 s later.
# The pytest runs mark each test as it starts and ends
# (tools/checks_last_test.py); a watchdog stops the group the same way once
# that mark is older than the idle limit.
run_stage() {  # name command...
  local start=$SECONDS limit idle rc last test before left pid idled=0
  limit=$(stage_limit "$2")
  idle=$(idle_limit)
  last=$(mktemp)
  before=$(compgen -G '/dev/shm/vllm_offload_*')
  CHECKS_LAST_TEST=$last timeout -k 20 "$limit" bash "$ROOT/tools/checks.sh" --stage "${@:2}" &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 2
    if [ -s "$last" ] && [ $(($(date +%s) - $(stat -c %Y "$last"))) -ge "$idle" ]; then
      # timeout(1) leads the stage's process group.
      idled=1
      kill -TERM -- -"$pid" 2>/dev/null
      for _ in {1..20}; do kill -0 "$pid" 2>/dev/null && sleep 1; done
      kill -KILL -- -"$pid" 2>/dev/null
      break
    fi
  done
  wait "$pid"
  rc=$?
  test=$(cat "$last")
  if [ "$idled" -eq 1 ]; then
    echo "!!! $1: no test started or ended for $idle s, every process of the stage killed; last test: ${test:-none}"
    RESULTS+=("FAIL  $1 (idle for $idle s, stopped; last test: ${test:-none})")
    status=1
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "!!! $1: stopped at its limit of $limit s, every process of the stage killed; last test started: ${test:-none}"
    RESULTS+=("FAIL  $1 (stopped at its limit of $limit s; last test started: ${test:-none})")
    status=1
  else
    record "$1" $rc $((SECONDS - start))
  fi
  rm -f "$last"
  mapfile -t left < <(left_regions "$before")
  if [ ${#left[@]} -gt 0 ]; then
    echo "--- $1: removed ${#left[@]} KV offload region file(s) its tests left in /dev/shm: ${left[*]}"
    rm -f -- "${left[@]}"
  fi
}

per_base() {  # name function
  for b in "${BASES[@]}"; do run_stage "$b: $1" "$2" "$b"; done
}

case "${1:-all}" in
  # One stage of a run above (run_stage): its function or command.
  --stage) "${@:2}"; exit ;;
  # Any command as a stage, under the same guard: stage NAME COMMAND...
  stage) run_stage "$2" "${@:3}" ;;
  lint) per_base lint stage_lint ;;
  check-each) per_base "each patch on its own" stage_each ;;
  upstream-tests) per_base "vLLM suites" stage_upstream_tests ;;
  project-tests) run_stage "project tests" stage_project_tests ;;
  e2e) run_stage "end to end" stage_e2e ;;
  all)
    per_base "series applies" stage_series
    per_base lint stage_lint
    per_base "each patch on its own" stage_each_before_suites
    per_base "vLLM suites" stage_upstream_tests
    run_stage "project tests" stage_project_tests
    run_stage "end to end" stage_e2e
    ;;
  *) echo "usage: $0 [all|lint|check-each|upstream-tests|project-tests|e2e|stage NAME COMMAND...]" >&2; exit 2 ;;
esac

echo "=== summary"
printf '%s\n' "${RESULTS[@]}"
exit $status

# Environment for running vLLM's own tests, and the demo, on a machine without
# a GPU or hub access, with base $BASE's .venv-$BASE first on PATH (default:
# the newest base of bases/). Sourced by tools/checks.sh and `make demo`;
# source it yourself from the repository root to run pytest by hand:
#   BASE=0.34.0; . tools/testenv.sh && cd build/vllm-0.34.0 && python -m pytest tests/v1/core/...
# Plain POSIX sh: make runs recipes with /bin/sh, which is dash on Debian.
# bash knows the path of a sourced file; other shells find it from the current
# folder, which must then be the repository root.
_ws_root=$(cd "$(dirname "${BASH_SOURCE:-tools/testenv.sh}")/.." 2>/dev/null && pwd)
if [ ! -f "$_ws_root/tools/testenv.sh" ]; then
  echo "tools/testenv.sh: cannot find the repository root from $PWD: source it from the repository root" >&2
  unset _ws_root
  return 1
fi
_ws_base=${BASE:-$(ls "$_ws_root/bases" | sort -V | tail -n 1)}
_ws_venv=$_ws_root/.venv-$_ws_base
if [ ! -x "$_ws_venv/bin/python" ]; then
  echo "tools/testenv.sh: $_ws_venv is missing: run \`make install BASE=$_ws_base\` first" >&2
  unset _ws_root _ws_base _ws_venv
  return 1
fi

# The wheel is the CUDA build; with no GPU vLLM would pick no platform and
# test teardown fails with "Cannot access accelerator device when none is
# available". The CPU platform is what this machine has.
export VLLM_TARGET_DEVICE=cpu
# No hub here: fail at once instead of retrying, and read model configs from
# the cache that tools/hf_cache.py generates from testenv/hf/ (checked-in
# config.json data of the hub models vLLM's tests name), generated here so
# that it exists and matches testenv/hf/ whenever the environment is used.
export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
export HF_HOME="$_ws_root/.cache/hf"
export PATH="$_ws_venv/bin:$PATH"
# What this base's vLLM needs on this machine kind (base.lock's test_env),
# without what only other bases need.
eval "$(python3 "$_ws_root/tools/ws.py" --base "$_ws_base" test-env)"
if ! "$_ws_venv/bin/python" "$_ws_root/tools/hf_cache.py" >/dev/null; then
  echo "tools/testenv.sh: tools/hf_cache.py failed to generate $HF_HOME" >&2
  unset _ws_root _ws_base _ws_venv
  return 1
fi
unset _ws_root _ws_base _ws_venv

# Environment for running vLLM's own tests on a machine without a GPU or hub
# access. Sourced by tools/checks.sh; source it yourself to run pytest by hand:
#   source tools/testenv.sh && cd build/vllm && pytest tests/v1/core/...
_ws_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# The wheel is the CUDA build; with no GPU vLLM would pick no platform and
# test teardown fails with "Cannot access accelerator device when none is
# available". The CPU platform is what this machine has.
export VLLM_TARGET_DEVICE=cpu
# No hub here: fail at once instead of retrying, and read model configs from
# the cache that tools/hf_cache.py generates from testenv/hf/ (checked-in
# config.json data of the hub models vLLM's tests name).
export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
export HF_HOME="$_ws_root/.cache/hf"
export PATH="$_ws_root/.venv/bin:$PATH"
unset _ws_root

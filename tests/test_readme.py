"""The README's other commands do what it says, run as a new user runs them
(the demo's are in tests/test_demo.py)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from test_demo import user_env

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_every_make_command_of_the_readme_is_a_target():
    targets = set(re.findall(r"(?:`|^|&& )make ([a-z][\w-]*)", README, re.M))
    assert {"demo", "test", "install", "export"} <= targets, targets
    for target in sorted(targets):
        res = subprocess.run(
            ["make", "-n", target],
            cwd=ROOT, env=user_env(), capture_output=True, text=True,
        )  # fmt: skip
        assert res.returncode == 0, (target, res.stderr)


def test_running_a_vllm_test_by_hand():
    # Needs the CPU platform, hub offline mode and the offline hub cache
    # (ModelConfig's default model), after `make install` alone.
    command = (
        "source tools/testenv.sh && cd build/vllm-0.34.0 && "
        "pytest tests/v1/core/test_kv_cache_planning.py"
    )
    assert command in README
    res = subprocess.run(
        ["bash", "-c", command + "::test_get_kv_cache_configs_multiple_workers"
         " -p no:cacheprovider -q"],
        cwd=ROOT, env=user_env(), capture_output=True, text=True,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "1 passed" in res.stdout

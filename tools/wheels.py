"""`make wheel`: a wheel of vLLM V with its series, for GPU machines.

The wheel is built from the pristine sdist plus patches/V/ (not from the
working tree), with the release wheel's compiled CUDA extensions, through
vLLM's own precompiled build path (VLLM_USE_PRECOMPILED, offline, from the
wheel that bases/V/base.lock pins). Its version is V plus a local label
naming the series: V+tprep.<first 10 hex digits of the series digest>, the
same for the same series. The wheel goes to dist/.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from ws import PRISTINE_DATE, Workspace, WsError, _digest, bases, run

LABEL = "tprep"
# Timestamps in the wheel's archive (bdist_wheel honours SOURCE_DATE_EPOCH).
SOURCE_DATE_EPOCH = str(
    int(datetime.strptime(PRISTINE_DATE, "%Y-%m-%dT%H:%M:%S%z").timestamp())
)


def series_digest(ws: Workspace) -> str:
    """The digest of the series: its file and its patches, in order."""
    return _digest([ws.series_file, *(ws.patches / name for name in ws.series())])


def version(ws: Workspace) -> str:
    """The version the wheel of this series carries."""
    return f"{ws.lock().version}+{LABEL}.{series_digest(ws)[:10]}"


def _tags(release_wheel: str) -> list[str]:
    """bdist_wheel options giving the wheel the release wheel's tags
    (vllm-V-cp38-abi3-manylinux_2_28_x86_64.whl: the stable ABI of CPython
    3.8+ on manylinux_2_28)."""
    _, _, python, abi, platform = release_wheel.removesuffix(".whl").split("-")
    if abi != "abi3":
        raise WsError(f"{release_wheel}: expected a stable-ABI (abi3) wheel")
    return [f"--py-limited-api={python}", f"--plat-name={platform}"]


def build_wheel(ws: Workspace, out: Path | None = None) -> Path:
    """Build vllm-<version>-*.whl from the series into `out` (default:
    dist/); return its path."""
    if (ws.tree / ".git").exists():
        # Work in the tree that the series lacks would be missing from the
        # wheel without a word: refuse, as `make tree` does.
        ws.check_no_unexported_work()
    lock = ws.lock()
    label = version(ws)
    out = out or ws.root / "dist"
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"vllm-{label}-*.whl"):
        old.unlink()
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / f"vllm-{lock.version}"
        ws.patched_sources(src, ws.series())
        run(
            [ws.python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
             "--no-index", "--wheel-dir", str(out), str(src),
             # The release wheel's tags: its extensions use the stable ABI.
             *(f"--config-settings=--build-option={opt}" for opt in _tags(lock.wheel.name))],
            env={
                "VLLM_USE_PRECOMPILED": "1",
                "VLLM_PRECOMPILED_WHEEL_LOCATION": str(ws.artifact_path(lock.wheel)),
                "VLLM_VERSION_OVERRIDE": label,
                "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH,
            },
            capture=True,
        )  # fmt: skip
    built = sorted(out.glob(f"vllm-{label}-*.whl"))
    if len(built) != 1:
        raise WsError(f"pip wheel left {len(built)} wheels of {label} in {out}")
    wheel = built[0]
    seconds = time.monotonic() - start
    shown = ws.rel(wheel) if wheel.is_relative_to(ws.root) else wheel
    print(
        f"{shown}: vLLM {lock.version} + {len(ws.series())} patches of "
        f"{ws.rel(ws.series_file)}, the CUDA extensions of {lock.wheel.name}; "
        f"{wheel.stat().st_size / 2**20:.0f} MiB, built in {seconds:.0f} s"
    )
    return wheel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="the base (default: every base in turn)")
    args = parser.parse_args(argv)
    try:
        for name in [args.base] if args.base else bases():
            build_wheel(Workspace(base=name))
    except WsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

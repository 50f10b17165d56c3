#!/usr/bin/env python3
"""Read bases/<V>/deselected.txt: `<pytest node id>  # <reason>` per line.

`deselected.py V --args` prints the pytest arguments that deselect base V's
entries, one per line, and that rerun once the tests of bases/<V>/rerun.txt
(same format; tools/ws_rerun_plugin.py); `deselected.py V` lists the
deselected tests with their reasons. An entry without a reason is an error:
every deselection and every rerun must say why.
"""

from __future__ import annotations

import sys
from pathlib import Path

BASES = Path(__file__).resolve().parent.parent / "bases"


def entries(base: str, name: str = "deselected.txt") -> list[tuple[str, str]]:
    return read(BASES / base / name)


def read(path: Path) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        node, sep, reason = line.partition("#")
        if not sep or not reason.strip():
            raise SystemExit(f"{path}:{lineno}: {node.strip()} has no '# reason'")
        out.append((node.strip(), reason.strip()))
    return out


def rerun_args(base: str) -> list[str]:
    """The pytest arguments that rerun base's listed tests once."""
    return ["-p", "ws_rerun_plugin", f"--rerun-list={BASES / base / 'rerun.txt'}"]


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[2] == "--args":
        for node, _ in entries(sys.argv[1]):
            print("--deselect")
            print(node)
        print("\n".join(rerun_args(sys.argv[1])))
    elif len(sys.argv) == 2:
        for node, reason in entries(sys.argv[1]):
            print(f"{node}: {reason}")
    else:
        raise SystemExit("usage: deselected.py <base> [--args]")

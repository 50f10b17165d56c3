#!/usr/bin/env python3
"""Read testenv/deselected.txt: `<pytest node id>  # <reason>` per line.

`--args` prints the pytest arguments that deselect them, one per line.
An entry without a reason is an error: every deselection must say why.
"""

from __future__ import annotations

import sys
from pathlib import Path

FILE = Path(__file__).resolve().parent.parent / "testenv" / "deselected.txt"


def entries(path: Path = FILE) -> list[tuple[str, str]]:
    out = []
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        node, sep, reason = line.partition("#")
        if not sep or not reason.strip():
            raise SystemExit(f"{path}:{lineno}: {node.strip()} has no '# reason'")
        out.append((node.strip(), reason.strip()))
    return out


if __name__ == "__main__":
    if sys.argv[1:] == ["--args"]:
        for node, _ in entries():
            print("--deselect")
            print(node)
    else:
        for node, reason in entries():
            print(f"{node}: {reason}")

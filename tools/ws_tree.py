"""A base's tree and series: build/vllm-V from the pristine sdist and
patches/V (`tree`), and back (`export`); `check-series`; snapshots."""

from __future__ import annotations

import contextlib
import hashlib
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ws_common import (
    WsError,
    run,
)

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


class TreeMixin:
    """Workspace's tree, series, export and snapshots."""

    @property
    def tag(self) -> str:
        return f"upstream-v{self.lock().version}"

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

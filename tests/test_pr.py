"""`make pr` (tools/pr.py): each patch of the 0.34.0 series is a pull request
whose description, in the release's PR form, comes from the patch itself."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pr
import pytest
import ws

ROOT = Path(__file__).resolve().parent.parent
BASE = "0.34.0"
SERIES = (ROOT / "patches" / BASE / "series").read_text().split()


@pytest.mark.parametrize("name", SERIES)
def test_each_description_is_the_patchs_own(name):
    patch = (ROOT / "patches" / BASE / name).read_text()
    title, sections = pr.describe(SERIES.index(name) + 1, len(SERIES), patch, BASE)
    subject = re.search(r"^Subject: \[PATCH\] (.*?)\n(?=\S)", patch, re.M | re.S)
    assert subject and title == " ".join(subject.group(1).split())
    assert [line for line in sections.splitlines() if line.startswith("## ")] == [
        f"## {s}" for s in pr.SECTIONS
    ]
    # The lines the PR adds under vllm/, as the tree's own commit of it says.
    tree = ws.Workspace(ROOT, BASE).tree
    commit = f"HEAD~{len(SERIES) - 1 - SERIES.index(name)}"
    numstat = subprocess.run(
        ["git", "-C", str(tree), "diff", "--numstat", f"{commit}~1", commit, "--", "vllm"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    added = sum(int(line.split("\t")[0]) for line in numstat.splitlines())
    assert f"+{added} / -" in sections
    # The test plan runs the test files the patch touches, and nothing else.
    touched = sorted(
        set(re.findall(r"^diff --git a/(tests/\S*/test_\w+\.py) ", patch, re.M))
    )
    assert re.findall(r"^pytest -q (\S+)$", sections, re.M) == touched
    assert "Signed-off-by" not in sections


def test_no_pr_removes_a_line_an_earlier_one_added():
    """The stack reads in merge order: every line a PR adds under vllm/ is
    there, credited to it by `git blame`, once every PR is merged."""
    tree = ws.Workspace(ROOT, BASE).tree

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(tree), *args], capture_output=True, text=True, check=True
        ).stdout

    base = f"HEAD~{len(SERIES)}"
    credited: Counter[str] = Counter()
    changed = git("diff", "--name-only", "--diff-filter=AM", base, "--", "vllm")
    for path in changed.split():
        blame = git("blame", "-s", "--abbrev=40", f"{base}..HEAD", "--", path)
        credited.update(line[:40] for line in blame.splitlines())
    commits = git("rev-list", "--reverse", f"{base}..HEAD").split()
    assert len(commits) == len(SERIES)
    for name, commit in zip(SERIES, commits):
        numstat = git("diff", "--numstat", f"{commit}~1", commit, "--", "vllm")
        added = sum(int(line.split("\t")[0]) for line in numstat.splitlines())
        assert credited[commit] == added, name


def test_make_pr_writes_every_pr_in_the_release_form():
    workspace = ws.Workspace(ROOT, BASE)
    template = workspace.tree / ".github" / "PULL_REQUEST_TEMPLATE.md"
    subprocess.run(
        [sys.executable, str(ROOT / "tools" / "pr.py"), "--base", BASE], check=True
    )
    folders = sorted((ROOT / "build" / "pr" / BASE).iterdir())
    assert [f.name[:2] for f in folders] == [
        f"{n:02d}" for n in range(1, len(SERIES) + 1)
    ]
    checklist = template.read_text().split("\n---\n", 1)[1]
    for folder, name in zip(folders, SERIES):
        assert (folder / name).read_bytes() == (
            ROOT / "patches" / BASE / name
        ).read_bytes()
        description = (folder / "description.md").read_text()
        assert description.startswith("# [") and checklist in description

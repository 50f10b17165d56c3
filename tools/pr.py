"""Write the pull requests of a base's series, in merge order, as upstream
would receive them: `make pr` -> build/pr/<base>/<NN>-<slug>/ with the PR's
patch and its description in upstream's PR form (the release's
.github/PULL_REQUEST_TEMPLATE.md), all taken from the series itself.

Each patch of patches/<base>/series is one PR; it applies on the release
with the PRs before it (`make check-each` checks each on its own)."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from email import message_from_string
from email.header import decode_header, make_header
from pathlib import Path

from ws_common import ROOT

SECTIONS = ("Overview", "Claims", "Validation", "Details")


def _message(patch: str) -> tuple[str, list[str]]:
    """The title and the body paragraphs of a `git format-patch` file."""
    head, _, _ = patch.partition("\n---\n")
    msg = message_from_string(head)
    title = str(make_header(decode_header(msg["Subject"] or "")))
    title = re.sub(r"^\[PATCH[^\]]*\]\s*", "", " ".join(title.split()))
    body = str(msg.get_payload())
    body = "\n".join(
        line for line in body.splitlines() if not line.startswith("Signed-off-by:")
    )
    return title, [p.strip() for p in body.strip().split("\n\n") if p.strip()]


def _stats(patch: str) -> tuple[dict[str, list[int]], list[str]]:
    """Lines added and removed per file (git's own count), and the test
    files touched."""
    numstat = subprocess.run(
        ["git", "apply", "--numstat", "-"],
        input=patch, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    files: dict[str, list[int]] = {}
    for line in numstat.splitlines():
        added, removed, path = line.split("\t", 2)
        files[path] = [int(added), int(removed)]
    tests = sorted(
        f for f in files if f.startswith("tests/") and Path(f).name.startswith("test_")
    )
    return files, tests


def describe(n: int, total: int, patch: str, base: str) -> tuple[str, str]:
    """The PR's title and its sections."""
    title, paragraphs = _message(patch)
    files, tests = _stats(patch)
    proof = [p for p in paragraphs if re.match(r"(Proven|Tested|Measured|Unsampled)", p)]
    # The overview: the first paragraph, with the list it introduces.
    overview = paragraphs[: 2 if paragraphs and paragraphs[0].endswith(":") else 1]
    details = [p for p in paragraphs if p not in proof and p not in overview]
    vllm = [v for f, v in files.items() if f.startswith("vllm/")]
    claims = [
        f"PR {n} of {total} of the KV-cache TP replication series, on vLLM "
        f"{base}" + (f", after PR{'s 1-' if n > 2 else ' '}{n - 1}." if n > 1 else "."),
        f"+{sum(a for a, _ in vllm)} / -{sum(r for _, r in vllm)} lines under "
        f"`vllm/` in {len(vllm)} files; {len(tests)} test files touched.",
    ]
    validation = proof + [
        "```bash",
        f"make check-each BASE={base}   # ruff, ruff format, mypy and the "
        "tests this PR touches, with the PRs before it",
        *(f"pytest -q {t}" for t in tests),
        "```",
    ]
    sections = {
        "Overview": "\n\n".join(overview) or title,
        "Claims": "\n".join(f"- {c}" for c in claims),
        "Validation": "\n\n".join(validation[: len(proof)])
        + ("\n\n" if proof else "")
        + "\n".join(validation[len(proof) :]),
        "Details": "\n\n".join(details),
    }
    return title, "\n\n".join(f"## {k}\n\n{sections[k]}" for k in SECTIONS)


def fill(template: str, title: str, sections: str) -> str:
    """Upstream's template with its section prompts replaced by ours."""
    lines = template.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("## "))
    end = next(i for i, line in enumerate(lines) if line.strip() == "---")
    return "\n".join([f"# {title}", *lines[:start], sections, "", *lines[end:], ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="0.34.0")
    args = parser.parse_args()
    patches = ROOT / "patches" / args.base
    series = (patches / "series").read_text().split()
    template_file = ROOT / "build" / f"vllm-{args.base}-base" / ".github"
    template_file = template_file / "PULL_REQUEST_TEMPLATE.md"
    if not template_file.exists():
        template_file = ROOT / "build" / f"vllm-{args.base}" / ".github"
        template_file = template_file / "PULL_REQUEST_TEMPLATE.md"
    template = template_file.read_text()
    out = ROOT / "build" / "pr" / args.base
    shutil.rmtree(out, ignore_errors=True)
    for n, name in enumerate(series, 1):
        patch = (patches / name).read_text()
        title, sections = describe(n, len(series), patch, args.base)
        slug = re.sub(r"[^a-z0-9]+", "-", re.sub(r"\[[^\]]*\]", "", title).lower())
        folder = out / f"{n:02d}-{slug.strip('-')[:50]}"
        folder.mkdir(parents=True)
        shutil.copyfile(patches / name, folder / name)
        (folder / "description.md").write_text(fill(template, title, sections))
        print(f"{folder.relative_to(ROOT)}: {title}")


if __name__ == "__main__":
    main()

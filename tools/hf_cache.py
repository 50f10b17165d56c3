#!/usr/bin/env python3
"""Generate the offline Hugging Face cache that vLLM's tests read.

vLLM's KV-cache tests build `ModelConfig`s for hub model ids (the default
`Qwen/Qwen3-0.6B`, `Qwen/Qwen1.5-7B`, `facebook/opt-125m`, ...). There is no
hub here, so testenv/hf/<org>/<name>/ holds each model's real hub files that
`ModelConfig` reads (config.json and friends, no weights), and this script lays
them out as a hub cache under $HF_HOME (tools/testenv.sh sets it to
.cache/hf), the way huggingface_hub stores a download:

    hub/models--<org>--<name>/refs/main           -> <revision>
    hub/models--<org>--<name>/snapshots/<revision>/<files>

The revision is derived from the files, so the cache is rebuilt exactly when
the checked-in data changes. Idempotent.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "testenv" / "hf"


def build(data: Path, hf_home: Path) -> list[str]:
    models = []
    for cfg in sorted(data.glob("*/*/config.json")):
        src = cfg.parent
        repo_id = f"{src.parent.name}/{src.name}"
        files = sorted(p for p in src.iterdir() if p.is_file())
        digest = hashlib.sha1()
        for f in files:
            digest.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
        revision = digest.hexdigest()
        repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
        snapshot = repo / "snapshots" / revision
        if not snapshot.exists():
            if repo.exists():
                shutil.rmtree(repo)
            tmp = repo.with_name(repo.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            (tmp / "snapshots" / revision).mkdir(parents=True)
            for f in files:
                shutil.copyfile(f, tmp / "snapshots" / revision / f.name)
            (tmp / "refs").mkdir()
            (tmp / "refs" / "main").write_text(revision)
            tmp.rename(repo)
        models.append(repo_id)
    return models


def main() -> int:
    hf_home = Path(os.environ.get("HF_HOME", ROOT / ".cache" / "hf"))
    models = build(DATA, hf_home)
    print(f"{hf_home}: offline hub cache for {', '.join(models)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

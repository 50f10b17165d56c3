"""`make wheel`: the wheel of each base, installed into a fresh virtual
environment, is vLLM V with its series and the release's compiled extensions.

The fresh environment gets only the wheel; the base's dependencies (torch
and the rest, already installed in .venv-V by `make setup`) are reached
through a .pth file written after the install, so nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest
import wheels
import ws

WORKER = Path(__file__).resolve().parent / "planning_worker.py"
NUM_MIXES = 40


@pytest.fixture(scope="module", params=ws.bases())
def installed(request, tmp_path_factory):
    """(workspace, wheel, python of a fresh venv holding only that wheel)."""
    workspace = ws.Workspace(base=request.param)
    wheel = wheels.build_wheel(workspace, tmp_path_factory.mktemp("dist"))
    venv = tmp_path_factory.mktemp(f"venv-{workspace.base}")
    subprocess.run(
        [workspace.python, "-m", "venv", "--without-pip", str(venv)], check=True
    )
    python = venv / "bin" / "python"
    subprocess.run(
        [workspace.python, "-m", "pip", "--python", str(python), "install",
         "--no-deps", "--no-index", "--quiet", str(wheel)],
        check=True,
    )  # fmt: skip
    purelib = Path(_purelib(python))
    assert not (purelib / "torch").exists()  # the wheel alone, no dependency
    (purelib / "base_dependencies.pth").write_text(_purelib(workspace.python) + "\n")
    return workspace, wheel, python


def _purelib(python: Path) -> str:
    return subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def _in(python: Path, code: str, workspace: ws.Workspace | None = None) -> dict:
    environ = os.environ if workspace is None else workspace.test_environ()
    env = {k: v for k, v in environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [python, "-c", code], check=True, capture_output=True, text=True, env=env
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_version_label_names_the_series(installed):
    workspace, wheel, python = installed
    label = wheels.version(workspace)
    assert re.fullmatch(rf"{re.escape(workspace.base)}\+tprep\.[0-9a-f]{{10}}", label)
    assert label == f"{workspace.base}+tprep.{wheels.series_digest(workspace)[:10]}"
    assert wheel.name.startswith(f"vllm-{label}-")
    found = _in(
        python,
        "import importlib.metadata as m, json, vllm; print(json.dumps("
        "{'version': vllm.__version__, 'dist': m.version('vllm'),"
        " 'file': vllm.__file__}))",
        workspace,
    )
    assert found["version"] == found["dist"] == label
    assert Path(found["file"]).parent == Path(_purelib(python)) / "vllm"


def test_the_patched_code_and_the_release_extensions_are_what_installs(installed):
    workspace, wheel, python = installed
    purelib = Path(_purelib(python))
    touched = [f for f in workspace.touched_files() if f.startswith("vllm/")]
    assert touched
    for name in touched:
        assert (purelib / name).read_bytes() == (workspace.tree / name).read_bytes()
    release = workspace.artifact_path(workspace.lock().wheel)
    libs = ws._extension_members(release)
    assert libs
    with zipfile.ZipFile(release) as zf:
        for name in libs:
            assert ws._same_as_member(purelib / name, zf.getinfo(name)), name
    # and the wheel holds no other compiled extension (no CPU build's)
    assert sorted(ws._extension_members(wheel)) == sorted(libs)


def test_planning_in_the_wheel_is_the_series_planning(installed, tmp_path):
    # The same random layer mixes planned by the installed wheel and by the
    # patched tree: identical plans and kv_tp_replicas, some of them > 1
    # from the layers' own max_tp_shards declarations.
    workspace, _, python = installed
    outs = {}
    for where, exe, path in (
        ("wheel", python, None),
        ("tree", workspace.python, str(workspace.tree)),
    ):
        out = tmp_path / f"{where}.json"
        environ = workspace.test_environ()
        env = {k: v for k, v in environ.items() if k != "PYTHONPATH"}
        if path:
            env["PYTHONPATH"] = path
        subprocess.run(
            [exe, str(WORKER), str(out), str(NUM_MIXES), "--base", workspace.base],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        outs[where] = json.loads(out.read_text())
    assert Path(outs["wheel"]["vllm"]).parent == Path(_purelib(python))
    assert Path(outs["tree"]["vllm"]) == workspace.tree / "vllm"
    results = outs["wheel"]["results"]
    assert results == outs["tree"]["results"]
    assert any((r["kv_tp_replicas"] or 1) > 1 for r in results)


def test_same_series_same_label_other_series_other_label(tmp_path):
    workspace = ws.Workspace(base=ws.bases()[0])
    copy = tmp_path / "patches"
    (copy / workspace.base).mkdir(parents=True)
    for path in workspace.patches.iterdir():
        (copy / workspace.base / path.name).write_bytes(path.read_bytes())
    other = ws.Workspace(base=workspace.base)
    other.patches = copy / workspace.base
    other.series_file = other.patches / "series"
    assert wheels.version(other) == wheels.version(workspace)
    first = other.patches / other.series()[0]
    first.write_bytes(first.read_bytes() + b"\n")
    assert wheels.version(other) != wheels.version(workspace)

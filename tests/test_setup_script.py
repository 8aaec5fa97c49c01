"""scripts/setup.sh on a first run that goes wrong: a failed `python -m venv` (Debian without
python3-venv), a half-made .venv, an interpreter without venv/ensurepip, one too old. Each runs the
real script in a copy of the repository's files it reads, with a real interpreter making a real
.venv; SETUP_DRY_RUN=1 makes it print its pip commands instead of running them, so nothing is
downloaded. The stand-ins are interpreters (shell scripts) that fail as a broken Python would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

REAL = sys.executable


def _checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", repo / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    return repo


def _interpreter(tmp_path: Path, name: str, body: str) -> Path:
    script = tmp_path / name
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script


def _setup(repo: Path, python: Path | str, *args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": str(python), "SETUP_DRY_RUN": "1"}
    env.pop("EXTRAS", None)
    if path is not None:
        env["PATH"] = path
    return subprocess.run(["bash", str(repo / "scripts" / "setup.sh"), *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def _pip_works(repo: Path) -> bool:
    """.venv's python runs as a virtualenv of its own (its prefix is .venv) and has pip."""
    python = str(repo / ".venv" / "bin" / "python")
    prefix = subprocess.run([python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True, check=False)
    pip = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, check=False)
    return Path(prefix.stdout.strip()).resolve() == (repo / ".venv").resolve() and pip.returncode == 0


def test_a_failed_venv_creation_then_a_rerun_succeeds(tmp_path: Path) -> None:
    """`python3 -m venv` without ensurepip leaves .venv/bin/python and fails; the run says so in one
    line and removes it; the next run (the package installed) makes a working .venv."""
    repo = _checkout(tmp_path)
    broken = _interpreter(tmp_path, "python-venv-fails", f"""if [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$3/bin" && ln -s {REAL} "$3/bin/python"
  echo "The virtual environment was not created successfully because ensurepip is not available." >&2
  exit 1
fi
exec {REAL} "$@" """)
    first = _setup(repo, broken)
    assert first.returncode != 0
    said = first.stderr.strip().splitlines()
    assert said[-1].startswith("setup.sh: ") and "-m venv .venv' failed" in said[-1], first.stderr
    assert not (repo / ".venv").exists()
    second = _setup(repo, REAL)
    assert second.returncode == 0, second.stderr
    assert _pip_works(repo)
    assert "pip install --quiet -e .[cpu,dev]" in second.stdout
    third = _setup(repo, REAL)  # a working .venv is kept
    assert third.returncode == 0 and "half-made" not in third.stdout, third.stdout


def test_a_half_made_venv_is_made_again(tmp_path: Path) -> None:
    """A .venv with a python but no pip (as an interrupted `python -m venv` leaves) is rebuilt, not used."""
    repo = _checkout(tmp_path)
    (repo / ".venv" / "bin").mkdir(parents=True)
    (repo / ".venv" / "bin" / "python").symlink_to(REAL)
    assert not _pip_works(repo)
    done = _setup(repo, REAL)
    assert done.returncode == 0, done.stderr
    assert "setup.sh: .venv is half-made" in done.stdout
    assert _pip_works(repo)


def test_python_3_10_gets_one_line_naming_the_supported_versions(tmp_path: Path) -> None:
    repo = _checkout(tmp_path)
    old = _interpreter(tmp_path, "python3.10", 'if [ "$1" = --version ]; then echo "Python 3.10.12"; exit 0; fi\nexit 1')
    done = _setup(repo, old)
    assert done.returncode != 0
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Python 3.10" in done.stderr and "3.11 or newer" in done.stderr, done.stderr
    assert not (repo / ".venv").exists()


def test_no_venv_module_names_the_package_and_installs_it_as_root(tmp_path: Path) -> None:
    """An interpreter without ensurepip: the Debian package is named; as root with apt-get, setup.sh
    runs `apt-get install python3.X-venv` (here an apt-get that records its arguments and fails)."""
    repo = _checkout(tmp_path)
    bare = _interpreter(tmp_path, "python-no-venv",
                        f'case "$*" in *"import ensurepip, venv"*) echo "No module named ensurepip" >&2; exit 1;; esac\nexec {REAL} "$@"')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt-get.log"
    _interpreter(bin_dir, "apt-get", f'echo "$*" >> {log}\n[ "$1" = update ]')
    done = _setup(repo, bare, path=f"{bin_dir}:{os.environ['PATH']}")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()
    assert len(last) == 1 and f"python{version}-venv" in last[0], done.stderr
    if os.getuid() == 0:
        assert f"install -y -qq python{version}-venv" in log.read_text()
    else:
        assert not log.exists()
    assert not (repo / ".venv").exists()


def test_gpu_switch_installs_the_gpu_extras_and_swaps_in_onnxruntime_gpu(tmp_path: Path) -> None:
    repo = _checkout(tmp_path)
    done = _setup(repo, REAL, "--gpu")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    install = lines.index("pip install --quiet --extra-index-url https://pypi.nvidia.com -e .[gpu,dev,tensorrt,gpu-serve]")
    uninstall = lines.index("pip uninstall --quiet -y onnxruntime onnxruntime-gpu")
    gpu_ort = next(i for i, line in enumerate(lines) if line.startswith("pip install --quiet onnxruntime-gpu[cuda,cudnn]"))
    assert install < uninstall < gpu_ort
    cpu = _setup(repo, REAL)
    assert "onnxruntime-gpu" not in cpu.stdout and "pip install --quiet -e .[cpu,dev]" in cpu.stdout
    wrong = _setup(repo, REAL, "--cuda")
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "--gpu" in wrong.stderr

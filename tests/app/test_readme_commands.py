"""The README's two set-up commands, run as a user runs them, on a fresh clone (issue 44).

The commands are read from the README itself (its ``## Run`` and ``## Test`` blocks), so the
test follows the README when it changes:

- **a fresh environment**: a new virtual environment without the system's packages, the run
  command's install, then ``soapbox --help`` and ``soapbox serve`` answering ``GET /`` with 200;
- **both commands in order in one environment**: the run command's install, a simulation (numba
  compiles and caches the event loop), ``soapbox serve``, then the test command's install
  (``pip install -e '.[test]'``), and ``soapbox --help``, ``soapbox serve`` and the engine's
  imports again from the editable checkout. This environment sees the system's packages
  (``--system-site-packages``): the test command's 3.4 GB of dependencies are the ones this
  suite runs in, so pip only installs soapbox itself, as it would on a second run of the
  README's commands. Before issue 44 the run install's numba cache files were left in
  ``site-packages/engine/`` and shadowed the editable package.

The test command's Chromium step and its ``python -m pytest`` are not run here (this is that
run); ``soapbox serve`` gets ``--port`` and ``--data-dir`` so it cannot meet a real server.
Needs ``git`` and the package index pip uses (the build backend, setuptools, is fetched or taken
from pip's cache as for any ``pip install .``).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
WAIT_S = 180  # generous: the machine may be busy


def _block(heading: str) -> str:
    """The first ```sh block under ``## heading`` in the README."""
    text = README.read_text()
    at = text.index(f"\n## {heading}\n")
    m = re.search(r"```sh\n(.*?)```", text[at:], re.S)
    assert m, f"no sh block under ## {heading}"
    return m.group(1).strip()


def _installs(command: str) -> list[str]:
    """The ``python -m pip install ...`` parts of a README command, in order."""
    parts = [p.strip().strip("()") for p in command.split("&&")]
    found = [p for p in parts if p.startswith("python -m pip install")]
    assert found, f"no pip install in {command!r}"
    return found


def _clone(tmp: Path) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout to clone (a fresh clone is what the README promises)")
    dest = tmp / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(dest)], check=True, timeout=300)
    return dest


def _venv(tmp: Path, system: bool) -> Path:
    where = tmp / ("venv-system" if system else "venv-fresh")
    cmd = [sys.executable, "-m", "venv", str(where)] + (["--system-site-packages"] if system else [])
    subprocess.run(cmd, check=True, timeout=300)
    return where / "bin"


def _run(cmd: str | list[str], cwd: Path, bin_dir: Path, timeout: float = 1800) -> str:
    """Run a README command (a string, through the shell) with ``bin_dir`` first on PATH, so
    ``python`` and ``soapbox`` are the environment's own, as after activating it."""
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    p = subprocess.run(cmd, shell=isinstance(cmd, str), cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, f"{cmd!r} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_answers(bin_dir: Path, cwd: Path, data_dir: Path) -> int:
    """Start the environment's ``soapbox serve`` and return ``GET /``'s status."""
    port = _free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    proc = subprocess.Popen([str(bin_dir / "soapbox"), "serve", "--port", str(port), "--data-dir", str(data_dir),
                             "--workers", "1"], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"soapbox serve exited ({proc.returncode}):\n{proc.stdout.read()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as r:
                    return r.status
            except OSError:
                time.sleep(0.5)
        raise AssertionError("soapbox serve did not answer GET / in time")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_the_readme_has_exactly_the_two_commands():
    run, test = _block("Run"), _block("Test")
    assert run.endswith("soapbox serve") and _installs(run) == ["python -m pip install ."]
    assert _installs(test) == ["python -m pip install -e '.[test]'"] and test.endswith("python -m pytest")


def test_run_command_in_a_fresh_environment(tmp_path):
    clone, bin_dir = _clone(tmp_path), _venv(tmp_path, system=False)
    for install in _installs(_block("Run")):
        _run(install, clone, bin_dir)
    assert "run the web explorer" in _run([str(bin_dir / "soapbox"), "--help"], tmp_path, bin_dir)
    assert _serve_answers(bin_dir, tmp_path, tmp_path / "data") == 200


def test_both_commands_in_order_in_one_environment(tmp_path):
    clone, bin_dir = _clone(tmp_path), _venv(tmp_path, system=True)
    elsewhere = tmp_path / "elsewhere"  # not the clone: its folders must not stand in for the package
    elsewhere.mkdir()
    for install in _installs(_block("Run")):
        _run(install, clone, bin_dir)
    out = _run([str(bin_dir / "soapbox"), "simulate", "--model", "alexnet", "--cluster", "p100-4x4", "--strategy",
                "data-parallel"], elsewhere, bin_dir)
    assert "iteration time" in out
    assert _serve_answers(bin_dir, elsewhere, tmp_path / "data") == 200
    for install in _installs(_block("Test")):
        _run(install, clone, bin_dir)
    assert "run the web explorer" in _run([str(bin_dir / "soapbox"), "--help"], elsewhere, bin_dir)
    where = _run([str(bin_dir / "python"), "-c", "import engine, app; from engine.taskgraph import BWD; "
                  "print(engine.__file__); print(app.__file__)"], elsewhere, bin_dir).split()
    assert all(Path(w).is_relative_to(clone) for w in where), where
    assert _serve_answers(bin_dir, elsewhere, tmp_path / "data") == 200

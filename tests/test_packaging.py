"""The built wheel holds every package and module of the source tree, and each package imports from it.

``pyproject.toml`` lists packages explicitly (automatic discovery drops a folder named ``tasks``); a
subpackage missing from that list is silently left out of the wheel, and only an installed copy
notices. This test builds the wheel with the project's own build backend (no network: no build
isolation) from a clean copy of the sources (an in-tree ``build/`` folder would keep stale
modules), unpacks it, and imports every package from the unpacked copy in a fresh interpreter
whose working directory is not the repository.

Run: ``pytest tests/test_packaging.py``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP = ("flows", "tasks", "models", "sandbox")


def source_modules() -> set[str]:
    """Every ``.py`` file under the top-level packages, as a path relative to the repository."""
    return {str(p.relative_to(ROOT)) for top in TOP for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts}


def source_packages() -> list[str]:
    return sorted(str(p.parent.relative_to(ROOT)).replace("/", ".") for top in TOP for p in (ROOT / top).rglob("__init__.py"))


def test_wheel_holds_and_imports_every_package(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for top in TOP:
        shutil.copytree(ROOT / top, src / top, ignore=shutil.ignore_patterns("__pycache__"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    (wheel,) = (tmp_path / "dist").glob("cleaner-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
        in_wheel = {n for n in zf.namelist() if n.endswith(".py")}
        data = set(zf.namelist()) - in_wheel
    assert "flows/prefect_logging.yml" in data  # the quiet commands' Prefect logging config (flows/terminal.py)
    missing = source_modules() - in_wheel
    assert not missing, f"modules missing from the wheel (add their package to pyproject.toml): {sorted(missing)}"

    packages = source_packages()
    assert {"tasks.rollout", "tasks.stores", "tasks.training"} <= set(packages)
    code = ("import importlib, json, sys\n"
            f"print(json.dumps({{p: importlib.import_module(p).__file__ for p in {packages!r}}}))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site)})
    assert run.returncode == 0, run.stderr
    files = json.loads(run.stdout)
    outside = {p: f for p, f in files.items() if not Path(f).is_relative_to(site)}
    assert not outside, f"imported from outside the wheel: {outside}"


def test_every_tasks_subpackage_is_in_the_layer_contract_and_nothing_is_ignored():
    """import-linter only checks what its contracts name: a ``tasks/`` subpackage left out of the layers (or an
    ignored import) may import upwards unnoticed."""
    import tomllib

    linter = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in linter["contracts"] if c.get("containers") == ["tasks"])["layers"]
    named = {part.strip() for layer in layers for part in layer.split("|")}
    subpackages = {p.parent.name for p in (ROOT / "tasks").glob("*/__init__.py")}
    assert subpackages - named == set()
    assert all("ignore_imports" not in c for c in linter["contracts"])

"""The lock files: they agree with pyproject, pin what broke, never pull CUDA, and this venv holds its lock.

``make lock-check`` (CI) also requires each venv to hold exactly its lock; here only the locked versions are
required, so a package a developer installed by hand before refreshing the lock does not fail the suite.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("cleaner_lock", ROOT / "infra" / "lock.py")
lock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lock)


@pytest.fixture
def copy(tmp_path) -> Path:
    for name in ("pyproject.toml", *lock.LOCKS):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def test_locks_agree_with_pyproject():
    assert lock.lock_problems(ROOT) == []


def test_an_edited_dependency_without_make_lock_is_caught(copy):
    py = copy / "pyproject.toml"
    py.write_text(py.read_text().replace('"tqdm",', '"tqdm",\n    "left-pad-nowhere>=1",', 1))
    problems = lock.lock_problems(copy)
    assert "requirements.lock was compiled from other pyproject requirements: run `make lock`" in problems
    assert "requirements.lock: left-pad-nowhere>=1 is not in the lock" in problems
    assert "requirements-verl.lock: left-pad-nowhere>=1 is not in the lock" in problems


def test_a_pin_outside_the_pyproject_range_is_caught(copy):
    for name in lock.LOCKS:
        path = copy / name
        path.write_text(path.read_text().replace("\nsqlalchemy==2.0.", "\nsqlalchemy==2.1."))
    problems = lock.lock_problems(copy)
    assert any(p.startswith("requirements.lock: sqlalchemy==2.1.") and p.endswith("does not satisfy sqlalchemy<2.1,>=2.0")
               for p in problems), problems


def test_the_locks_differ_only_where_verl_forces_it(copy):
    _, base = lock.read_lock(copy / "requirements.lock")
    _, verl = lock.read_lock(copy / "requirements-verl.lock")
    assert base["antlr4-python3-runtime"].startswith("4.13") and verl["antlr4-python3-runtime"].startswith("4.9")
    assert Version(base["packaging"]) >= Version("26") > Version(verl["packaging"])
    assert {p for p in base.keys() & verl.keys() if base[p] != verl[p]} == {"antlr4-python3-runtime", "packaging"}
    path = copy / "requirements-verl.lock"
    path.write_text(path.read_text().replace(f"\nzipp=={verl['zipp']}\n", "\nzipp==0.0.1\n"))
    expected = (f"zipp: {base['zipp']} vs 0.0.1 between the locks "
                "(only ['antlr4-python3-runtime', 'packaging'] may differ)")
    assert lock.lock_problems(copy) == [expected]


def test_the_verl_lock_holds_what_verls_default_trainer_imports():
    """verl 0.9.1's V1 trainer (its default) imports ``transfer_queue``: TransferQueue >= 0.1.10 (verl's own
    ``verl-core`` extra), which needs tensordict >= 0.10 where verl allows <= 0.10.0."""
    _, verl = lock.read_lock(ROOT / "requirements-verl.lock")
    assert Version(verl["transferqueue"]) >= Version("0.1.10") and verl["tensordict"] == "0.10.0"
    assert "transferqueue" not in lock.read_lock(ROOT / "requirements.lock")[1]


@pytest.mark.parametrize("name", sorted(lock.LOCKS))
def test_lock_pins_what_broke_and_takes_the_cpu_torch(name):
    _, pins = lock.read_lock(ROOT / name)
    assert Version(pins["sqlalchemy"]) < Version("2.1"), "Prefect 3.8's scheduler fails with SQLAlchemy 2.1"
    assert Version(pins["fastapi"]) < Version("0.151"), "Prefect 3.8 flow runs fail with FastAPI 0.151"
    assert pins["torch"] == "2.13.0+cpu"
    cuda = sorted(p for p in pins if p.startswith(("nvidia-", "cuda-")) or p == "triton")
    assert cuda == [], f"{name} pulls CUDA packages: {cuda}"


def test_read_lock_refuses_an_unpinned_line(tmp_path):
    bad = tmp_path / "x.lock"
    bad.write_text("# header\nrequests>=2\n")
    with pytest.raises(ValueError, match="'requests>=2' is not pinned with =="):
        lock.read_lock(bad)


def test_this_venv_holds_its_lock():
    assert lock.installed_problems(ROOT / "requirements.lock", exact=False) == []


def test_installed_check_names_missing_and_extra_packages(tmp_path):
    fake = tmp_path / "fake.lock"
    fake.write_text("# header\nduckdb==0.0.1\nnot-a-real-package-xyz==1.0\n")
    problems = lock.installed_problems(fake, exact=True)
    assert "not-a-real-package-xyz: locked 1.0, installed nothing" in problems
    assert any(p.startswith("duckdb: locked 0.0.1, installed ") for p in problems)
    assert any(p.startswith("polars ") and p.endswith("is installed but not in fake.lock") for p in problems)

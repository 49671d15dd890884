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
    for name in ("pyproject.toml", *lock.all_locks()):
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


def test_the_gpu_lock_is_one_consistent_cuda_set_that_pyproject_allows():
    """verl 0.9.1 with SGLang 0.5.14 (the newest SGLang whose transformers pin verl allows), their torch and
    transformers, and flash-attn (verl's default attention): PyPI's CUDA torch with its CUDA libraries; pyproject's
    torch range holds both this and the CPU locks' pin."""
    _, gpu = lock.read_lock(ROOT / lock.GPU_LOCK)
    assert {k: gpu[k] for k in ("verl", "sglang", "torch", "transformers", "flash-attn")} == {
        "verl": "0.9.1", "sglang": "0.5.14", "torch": "2.11.0", "transformers": "5.8.1", "flash-attn": "2.8.3"}
    assert any(p.startswith("nvidia-") for p in gpu) and not gpu["torch"].endswith("+cpu")
    torch_req = next(r for r in lock.requirements(ROOT / "pyproject.toml", ()) if r.name == "torch")
    _, cpu = lock.read_lock(ROOT / "requirements.lock")
    assert torch_req.specifier.contains(Version(gpu["torch"])) and torch_req.specifier.contains(Version(cpu["torch"]))


def test_an_edited_gpu_extra_without_make_lock_is_caught(copy):
    py = copy / "pyproject.toml"
    py.write_text(py.read_text().replace('"sglang==0.5.14"', '"sglang==0.5.15"', 1))
    problems = lock.lock_problems(copy)
    assert "requirements-gpu.lock was compiled from other pyproject requirements: run `make lock`" in problems
    assert "requirements-gpu.lock: sglang==0.5.14 does not satisfy sglang==0.5.15" in problems


def _fake_uv(tmp_path, body: str) -> str:
    uv = tmp_path / "uv"
    uv.write_text("#!/bin/sh\n" + body)
    uv.chmod(0o755)
    return str(uv)


def test_resolves_names_every_pin_that_moved_and_a_failed_resolution(copy, tmp_path):
    """``lock.py resolves`` (``make lock-check``) re-resolves the GPU lock into a copy; here a stand-in for uv that
    moves torch and drops flash-attn in the file it is given, or fails."""
    out = 'while [ "$1" != "-o" ]; do shift; done; '
    moved = _fake_uv(tmp_path, out + "sed -i -e 's/^torch==2.11.0$/torch==2.11.1/' -e '/^flash-attn==/d' \"$2\"\n")
    assert lock.resolve_problems(copy, moved) == [
        "requirements-gpu.lock: flash-attn 2.8.3 now resolves to absent: run `make lock`",
        "requirements-gpu.lock: torch 2.11.0 now resolves to 2.11.1: run `make lock`"]
    assert lock.resolve_problems(copy, _fake_uv(tmp_path, "exit 0\n")) == []
    failed = lock.resolve_problems(copy, _fake_uv(tmp_path, "exit 1\n"))
    assert len(failed) == 1 and failed[0].startswith("requirements-gpu.lock: pyproject's verl, gpu no longer resolve for x86_64-manylinux_2_34")

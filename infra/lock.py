"""Lock files: what a fresh machine installs, exactly, for each virtualenv.

    python infra/lock.py compile [--upgrade]        # `make lock` / `make lock-upgrade`: rewrite the locks with uv
    python infra/lock.py check                      # pyproject and locks agree (CI and tests/test_lock.py)
    python infra/lock.py resolves --uv UV           # the GPU lock still resolves, to the same pins (`make lock-check`)
    python infra/lock.py installed requirements.lock [--exact]   # this interpreter holds exactly that lock

Two environments, two locks (``LOCKS``): ``.venv`` (base + test) and ``.venv-verl`` (base + test + verl). They
differ where verl forces it (``SPLIT``: verl pins antlr4 4.9, which breaks math-verify's LaTeX parser; its V1
trainer's TransferQueue pulls packaging below 26); every other package has the same version in both. ``make setup``
installs a lock with pip, then the project with ``--no-deps``.

What it simplifies: the locks are ``uv pip compile`` output for CPython 3.11.7 (this machine's) on x86_64 Linux, with torch taken
from the local CPU wheel folder (``--find-links``, default ``/opt/wheels``), never PyPI's CUDA build. Each lock
records a digest of the pyproject it was compiled from, so an edit without ``make lock`` is caught by ``check``
(any edit: a refreshed lock is then committed after the pyproject change, whatever it was).
A refresh keeps existing pins (uv reads the old lock as preferences) unless ``--upgrade``.

A third lock, ``GPU_LOCK`` (``requirements-gpu.lock``: base + verl + gpu), is what a Linux x86_64 CUDA node installs
(docs/run_at_scale.md): uv resolves it here for that platform (``GPU_PLATFORM``: SGLang's wheels need glibc 2.34) from
package metadata only — nothing is installed, nothing CUDA downloaded, and never the CPU torch wheel folder. It pins
other torch / transformers releases than the CPU locks (verl 0.9.1 with SGLang 0.5.14: torch 2.11.0, transformers
5.8.1), so it is checked against pyproject but not against them. flash-attn (verl's default attention,
``flash_attention_2``) ships only a source archive; its static metadata (``GPU_METADATA``, the archive's PKG-INFO) is
given to uv so that resolving never fetches or builds it. ``resolves`` re-resolves the GPU lock with its own pins as
preferences and reports every pin that moved (a yanked release, a pin no longer consistent): it needs PyPI, not a GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCKS = {"requirements.lock": ("test",), "requirements-verl.lock": ("test", "verl")}
SPLIT = {"antlr4-python3-runtime": "verl pins 4.9 (through hydra/omegaconf); math-verify's LaTeX parser needs 4.13",
         "packaging": "verl's V1 trainer needs TransferQueue (tensordict>=0.10) and verl tensordict<=0.10.0; tensordict "
                      "0.10.0 needs pyvers 0.1, which pins packaging<26"}
TARGET = {"python_version": "3.11", "python_full_version": "3.11.7", "sys_platform": "linux",
          "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
          "implementation_name": "cpython", "platform_python_implementation": "CPython"}
GPU_LOCK, GPU_EXTRAS = "requirements-gpu.lock", ("verl", "gpu")
GPU_PLATFORM = "x86_64-manylinux_2_34"
GPU_METADATA = '[[dependency-metadata]]\nname = "flash-attn"\nversion = "2.8.3"\nrequires-dist = ["torch", "einops"]\n'
"""uv settings for the GPU lock: flash-attn 2.8.3's Requires-Dist as its source archive's PKG-INFO states them."""
DIGEST_PREFIX = "# pyproject sha256: "
NOT_LOCKED = {"pip", "setuptools", "wheel", "cleaner"}


def requirements(pyproject: Path, extras: tuple[str, ...]) -> list[Requirement]:
    """The base requirements plus those of ``extras``, as written in ``pyproject``."""
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise KeyError(f"{pyproject}: no optional-dependencies {unknown}; have {sorted(optional)}")
    return [Requirement(r) for r in [*project["dependencies"], *(r for e in extras for r in optional[e])]]


def digest(pyproject: Path, extras: tuple[str, ...]) -> str:
    """Of the whole pyproject (not only its requirements): any edit asks for ``make lock``, so the lock is
    never older than the pyproject it was made from."""
    return hashlib.sha256(json.dumps(list(extras)).encode() + pyproject.read_bytes()).hexdigest()


def read_lock(lock: Path) -> tuple[str | None, dict[str, str]]:
    """(recorded digest, {normalised name: version}) of a lock file."""
    recorded, pins = None, {}
    for line in lock.read_text().splitlines():
        if line.startswith(DIGEST_PREFIX):
            recorded = line[len(DIGEST_PREFIX):].split()[0]
        elif line and not line.startswith((" ", "#", "-")):
            name, _, version = line.split(" ", 1)[0].partition("==")
            if not version:
                raise ValueError(f"{lock}: {line!r} is not pinned with ==")
            pins[canonicalize_name(name.split("[")[0])] = version
    return recorded, pins


def compile_lock(root: Path, uv: str, name: str, extras: tuple[str, ...], out: Path, find_links: str,
                 upgrade: bool = False) -> None:
    """``uv pip compile`` of pyproject with ``extras`` into ``out`` (``out``'s pins, if any, are preferences), stamped
    with its requirements digest; ``name`` == ``GPU_LOCK`` resolves for the CUDA platform, from PyPI only."""
    argv = [uv, "pip", "compile", str(root / "pyproject.toml"), *(a for e in extras for a in ("--extra", e)),
            "--python-version", TARGET["python_full_version"], "--custom-compile-command", "make lock", "--quiet",
            "-o", str(out)]
    with tempfile.TemporaryDirectory() as tmp:
        if name == GPU_LOCK:
            (Path(tmp) / "uv.toml").write_text(GPU_METADATA)
            argv += ["--python-platform", GPU_PLATFORM, "--config-file", str(Path(tmp) / "uv.toml")]
        else:
            argv += ["--python-platform", "x86_64-unknown-linux-gnu", "--find-links", find_links]
        subprocess.run(argv + (["--upgrade"] if upgrade else []), check=True, cwd=root)
    lines = [ln for ln in out.read_text().splitlines() if not ln.startswith(DIGEST_PREFIX)]
    at = next(i for i, ln in enumerate(lines) if not ln.startswith("#"))
    lines.insert(at, f"{DIGEST_PREFIX}{digest(root / 'pyproject.toml', extras)} (extras: {', '.join(extras)})")
    out.write_text("\n".join(lines) + "\n")


def all_locks() -> dict[str, tuple[str, ...]]:
    return {**LOCKS, GPU_LOCK: GPU_EXTRAS}


def compile_locks(root: Path, uv: str, find_links: str, upgrade: bool) -> None:
    """Rewrite every lock with ``uv pip compile`` and stamp it with its requirements digest."""
    for name, extras in all_locks().items():
        compile_lock(root, uv, name, extras, root / name, find_links, upgrade)


def resolve_problems(root: Path, uv: str) -> list[str]:
    """The GPU lock resolved again (its pins as preferences, into a copy): every pin that moved, appeared or went."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / GPU_LOCK
        shutil.copy(root / GPU_LOCK, out)
        try:
            compile_lock(root, uv, GPU_LOCK, GPU_EXTRAS, out, "")
        except subprocess.CalledProcessError as err:
            return [f"{GPU_LOCK}: pyproject's {', '.join(GPU_EXTRAS)} no longer resolve for {GPU_PLATFORM} ({err})"]
        (_, was), (_, now) = read_lock(root / GPU_LOCK), read_lock(out)
    return [f"{GPU_LOCK}: {pkg} {was.get(pkg, 'absent')} now resolves to {now.get(pkg, 'absent')}: run `make lock`"
            for pkg in sorted(was.keys() | now.keys()) if was.get(pkg) != now.get(pkg)]


def lock_problems(root: Path) -> list[str]:
    """Why the locks do not match pyproject (or each other); empty when they agree."""
    problems, pinned = [], {}
    for name, extras in all_locks().items():
        lock = root / name
        if not lock.exists():
            problems.append(f"{name} is missing: run `make lock`")
            continue
        recorded, pins = read_lock(lock)
        pinned[name] = pins
        if recorded != digest(root / "pyproject.toml", extras):
            problems.append(f"{name} was compiled from other pyproject requirements: run `make lock`")
        for req in requirements(root / "pyproject.toml", extras):
            if req.marker and not req.marker.evaluate(TARGET):
                continue
            have = pins.get(canonicalize_name(req.name))
            if have is None:
                problems.append(f"{name}: {req} is not in the lock")
            elif not req.specifier.contains(Version(have), prereleases=True):
                problems.append(f"{name}: {req.name}=={have} does not satisfy {req}")
    if all(name in pinned for name in LOCKS):
        base, *others = (pinned[name] for name in LOCKS)
        for other in others:
            for pkg in sorted(base.keys() & other.keys()):
                if base[pkg] != other[pkg] and pkg not in SPLIT:
                    problems.append(f"{pkg}: {base[pkg]} vs {other[pkg]} between the locks (only {sorted(SPLIT)} may differ)")
    return problems


def installed_problems(lock: Path, exact: bool) -> list[str]:
    """Differences between this interpreter's packages and ``lock``; ``exact`` also reports unlocked extras."""
    _, pins = read_lock(lock)
    have = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    problems = [f"{pkg}: locked {version}, installed {have.get(pkg, 'nothing')}"
                for pkg, version in sorted(pins.items()) if have.get(pkg) != version]
    if exact:
        problems += [f"{pkg} {have[pkg]} is installed but not in {lock.name}"
                     for pkg in sorted(have.keys() - pins.keys() - NOT_LOCKED)]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    comp = sub.add_parser("compile", help="rewrite the locks with uv")
    comp.add_argument("--uv", default="uv")
    comp.add_argument("--find-links", default="/opt/wheels", help="folder holding the CPU torch wheel")
    comp.add_argument("--upgrade", action="store_true", help="newest versions allowed, not the old pins")
    sub.add_parser("check", help="pyproject and the locks agree")
    res = sub.add_parser("resolves", help="the GPU lock still resolves for its platform, to the same pins")
    res.add_argument("--uv", default="uv")
    inst = sub.add_parser("installed", help="this interpreter holds the lock's versions")
    inst.add_argument("lock", type=Path)
    inst.add_argument("--exact", action="store_true", help="also fail on installed packages the lock lacks")
    args = parser.parse_args(argv)
    if args.cmd == "compile":
        compile_locks(ROOT, args.uv, args.find_links, args.upgrade)
        problems = lock_problems(ROOT)
    elif args.cmd == "check":
        problems = lock_problems(ROOT)
    elif args.cmd == "resolves":
        problems = resolve_problems(ROOT, args.uv)
    else:
        problems = installed_problems(args.lock, args.exact)
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

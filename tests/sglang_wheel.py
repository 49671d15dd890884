"""SGLang's own code for the tests, read from its wheels, never installed.

SGLang cannot be installed on a CPU machine (its wheel set pins a CUDA torch), but the parts of it that define the
HTTP contract are plain Python: ``sglang_sources(version)`` fetches ``sglang==version``'s wheel with ``pip download
--no-deps`` (once, into ``$CLEANER_SGLANG_WHEELS``, default ``~/.cache/cleaner/sglang-wheels``) and unpacks the
files below; ``module`` imports one file alone (``sampling_params.py``, ``api_types.py``: stdlib and msgspec only);
``definitions`` executes only the named classes and methods of a file that cannot be imported (``schedule_batch.py``
imports CUDA kernels), so the finish reasons and the stop rule the tests compare with are SGLang's own text.

``PINNED``: the release ``requirements-gpu.lock`` pins (0.5.14). ``TYPES``: a release that ships the generated JSON
types ``sglang/api/v1/api_types.py`` (msgspec Structs of every request and response; 0.5.14 predates them).
"""

from __future__ import annotations
import __future__

import ast
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("cleaner_lock", ROOT / "infra" / "lock.py")
_lock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_lock)
PINNED = _lock.read_lock(ROOT / _lock.GPU_LOCK)[1]["sglang"]
TYPES = "0.5.23"
FILES = ("sglang/srt/sampling/sampling_params.py", "sglang/srt/managers/schedule_batch.py",
         "sglang/srt/managers/io_struct.py", "sglang/srt/managers/tokenizer_manager.py",
         "sglang/srt/configs/model_config.py", "sglang/srt/entrypoints/http_server.py", "sglang/api/v1/api_types.py",
         "sglang/srt/managers/scheduler_components/logprob_result_processor.py", "sglang/srt/managers/scheduler.py")
CACHE = Path(os.environ.get("CLEANER_SGLANG_WHEELS", Path.home() / ".cache" / "cleaner" / "sglang-wheels"))


def sglang_sources(version: str) -> Path:
    """A folder holding ``FILES`` (those the release has) of ``sglang==version``'s Linux x86_64 wheel; a folder
    unpacked for another ``FILES`` (its ``.complete`` lists them) is unpacked again."""
    target, marker = CACHE / version, "\n".join(FILES)
    if (target / ".complete").exists() and (target / ".complete").read_text() == marker:
        return target
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--platform",
                "manylinux_2_34_x86_64", "--python-version", "3.11", "--implementation", "cp", "-q", "-d", tmp,
                f"sglang=={version}"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"pip download sglang=={version} failed (PyPI is needed): {proc.stderr[-1500:]}")
        with zipfile.ZipFile(next(Path(tmp).glob("sglang-*.whl"))) as wheel:
            wheel.extractall(target, [name for name in wheel.namelist() if name in FILES])
    (target / ".complete").write_text(marker)
    return target


def module(version: str, path: str, name: str):
    """Import one file of the wheel on its own, as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, sglang_sources(version) / path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def definitions(version: str, path: str, names: list[str], namespace: dict | None = None) -> dict:
    """Execute only the top-level classes and functions ``names`` of a wheel file, and ``Class.method`` as a plain
    function (called with any object standing for ``self``); returns the namespace they were defined in."""
    tree = ast.parse((sglang_sources(version) / path).read_text())
    top = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef | ast.FunctionDef)}
    picked = []
    for name in names:
        cls, _, method = name.partition(".")
        node = top[cls] if not method else next(n for n in top[cls].body
                                                if isinstance(n, ast.FunctionDef) and n.name == method)
        picked.append(node)
    ns = {"__name__": f"sglang_{version}_{Path(path).stem}", **(namespace or {})}
    code = compile(ast.Module(body=picked, type_ignores=[]), str(path), "exec",
                   flags=__future__.annotations.compiler_flag)  # annotations stay text, as in SGLang's file
    exec(code, ns)  # noqa: S102 — SGLang's own code
    return ns


def fields(version: str, path: str, cls: str) -> set[str]:
    """The annotated field names of a dataclass in a wheel file (``GenerateReqInput``: what ``/generate`` reads)."""
    tree = ast.parse((sglang_sources(version) / path).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    own = {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
    return own.union(*(fields(version, path, b) for b in bases if any(
        isinstance(n, ast.ClassDef) and n.name == b for n in tree.body)))

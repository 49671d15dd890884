"""LoRA adapters on a frozen base model (``peft``): add, load, sync, link and merge.

A policy checkpoint is either a full ``save_pretrained`` folder or an **adapter folder**:
``adapter_config.json`` + ``adapter_model.safetensors`` (peft's files) + the tokenizer files,
where ``base_model_name_or_path`` names the frozen base folder. An adapter folder loads the
usual ways — ``AutoModelForCausalLM.from_pretrained(folder)`` (transformers attaches the
adapter when peft is installed) or ``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base),
folder)`` — and ``load_policy`` here does the second.

The base is frozen and shared: every checkpoint of a run holds only the adapter (a few MB) and
points at the same base folder; the trainer keeps one trainable copy per process and loads each
checkpoint's adapter weights into it (``trainable_policy``), and the in-process engine syncs
only the adapter weights (``load_adapter_weights``). ``link_adapter`` copies an adapter so it
points at a given base (a run's start checkpoint, a committed adapter used with a base converted
elsewhere); ``compact_adapter`` stores one in float16 without tokenizer files (a committed
asset); ``merge_adapter`` writes base + adapter as one plain folder, for servers that load
full weights (SGLang's ``update_weights_from_disk``).

Run: ``load_policy("assets/smollm2-135m-tool-lora")`` (its base: ``runs/models/smollm2-135m``,
converted by ``models.smollm2.convert``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from models.config import LoraSpec

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
TOKENIZER_PREFIXES = ("tokenizer", "special_tokens", "chat_template", "vocab", "merges", "added_tokens")
_trainable: dict[str, object] = {}


def is_adapter(path: str | Path) -> bool:
    """Whether ``path`` is a peft adapter folder (not a full model)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def base_of(path: str | Path) -> Path:
    """The base folder an adapter points at; an error naming both when it does not exist."""
    conf = json.loads((Path(path) / ADAPTER_CONFIG).read_text())
    base = Path(conf.get("base_model_name_or_path") or "")
    if not (base / "config.json").is_file():
        raise FileNotFoundError(
            f"adapter {path}: its base model {str(base)!r} is not a model folder; convert it "
            f"(model.build: smollm2 does so on first use) or point the adapter at it (model.base)")
    return base


def add_lora(model, spec: LoraSpec):
    """Wrap ``model`` with fresh LoRA layers (B = 0, so the output is the base's); only they train."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                        target_modules=list(spec.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def _base_model(base: Path, device: str):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).to(device)


def load_policy(path: str | Path, device: str = "cpu", trainable: bool = False):
    """A checkpoint as a model: a full folder via ``from_pretrained``, an adapter as base + ``PeftModel``."""
    if not is_adapter(path):
        return _base_model(Path(path), device).eval()
    from peft import PeftModel  # only an adapter needs peft (``models.gpu_check`` runs without it)

    model = PeftModel.from_pretrained(_base_model(base_of(path), device), str(path), is_trainable=trainable)
    return model.to(device).train(trainable) if trainable else model.eval()


def load_adapter_weights(model, path: str | Path) -> None:
    """Load the adapter weights of checkpoint ``path`` into a live peft ``model`` (the weight sync).

    The adapter must have the same shape (rank, target modules) as the one ``model`` was built with."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(str(Path(path) / ADAPTER_WEIGHTS))
    result = set_peft_model_state_dict(model, state)
    missing = [k for k in result.missing_keys if "lora_" in k]
    if result.unexpected_keys or missing:
        raise ValueError(f"adapter {path} does not fit the live model: unexpected {result.unexpected_keys[:3]}, "
                         f"missing {missing[:3]}")


def trainable_policy(path: str | Path, device: str = "cpu"):
    """The process's trainable copy of the base + adapter of ``path``, holding ``path``'s adapter weights.

    Built once per (base, adapter shape, device); later calls only load the adapter weights, so the
    base is read from disk once per process."""
    conf = json.loads((Path(path) / ADAPTER_CONFIG).read_text())
    shape = {k: conf.get(k) for k in ("r", "lora_alpha", "target_modules", "lora_dropout")}
    key = json.dumps([str(base_of(path).resolve()), shape, device], sort_keys=True, default=str)
    if key not in _trainable:
        _trainable[key] = load_policy(path, device, trainable=True)
    else:
        load_adapter_weights(_trainable[key], path)
    model = _trainable[key]
    model.train()
    return model


def trainable_parameters(model) -> list:
    """The parameters an optimizer should see: all of them for a full model, the adapter's for a peft model."""
    return [p for p in model.parameters() if p.requires_grad]


def copy_tokenizer(src: str | Path, dst: str | Path) -> None:
    """Copy the tokenizer files of folder ``src`` into ``dst``."""
    for f in Path(src).iterdir():
        if f.is_file() and f.name.startswith(TOKENIZER_PREFIXES):
            shutil.copy2(f, Path(dst) / f.name)


def link_adapter(adapter: str | Path, base: str | Path, out_dir: str | Path) -> Path:
    """Copy adapter folder ``adapter`` to ``out_dir`` pointing at ``base`` (absolute path); atomic. An adapter
    without tokenizer files (a compacted one) gets the base's."""
    base, out_dir = Path(base).resolve(), Path(out_dir)
    if not (base / "config.json").is_file():
        raise FileNotFoundError(f"model.base: {base} is not a model folder")
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(adapter, tmp)
    if not any(f.name.startswith("tokenizer") for f in tmp.iterdir()):
        copy_tokenizer(base, tmp)
    conf = json.loads((tmp / ADAPTER_CONFIG).read_text())
    conf["base_model_name_or_path"] = str(base)
    (tmp / ADAPTER_CONFIG).write_text(json.dumps(conf, indent=2, sort_keys=True))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def merge_adapter(adapter: str | Path, out_dir: str | Path) -> Path:
    """Base + adapter merged into one plain ``save_pretrained`` folder (weights + tokenizer) at ``out_dir``."""
    model = load_policy(adapter).merge_and_unload()
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    copy_tokenizer(adapter, tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def compact_adapter(path: str | Path) -> Path:
    """Shrink an adapter folder for committing: weights stored as float16 (half the bytes; loading casts them
    back to the model's float32), no tokenizer files (``link_adapter`` copies the base's) and no peft
    template ``README.md`` (the warm-up writes ``MODEL_CARD.md``)."""
    import torch
    from safetensors.torch import load_file, save_file

    path = Path(path)
    weights = load_file(str(path / ADAPTER_WEIGHTS))
    save_file({k: v.to(torch.float16) for k, v in weights.items()}, str(path / ADAPTER_WEIGHTS),
              metadata={"format": "pt"})
    for f in path.iterdir():
        if f.name.startswith(TOKENIZER_PREFIXES) or f.name == "README.md":  # README.md: peft's empty template
            f.unlink()
    return path

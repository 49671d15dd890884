"""The process-wide engine cache: checkpoints of one model share an engine; another model gets its own.

Found by the full suite: an evaluation of ``assets/tiny-env`` after a run of ``assets/tiny-warm`` in one process
reused the first engine and failed on a state-dict shape mismatch.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from models.config import ChatConfig, EngineConfig
from tasks.training.live import architecture, get_chat, get_engine

ROOT = Path(__file__).resolve().parents[1]


def test_two_models_in_one_process_get_two_engines_and_checkpoints_of_one_share(warm_model_dir, tmp_path):
    env_model = ROOT / "assets" / "tiny-env"
    assert architecture(str(warm_model_dir)) != architecture(str(env_model))
    cfg = EngineConfig()
    warm = get_engine(cfg, str(warm_model_dir), get_chat(str(warm_model_dir), ChatConfig()))
    other = get_engine(cfg, str(env_model), get_chat(str(env_model), ChatConfig()))
    assert other is not warm and other.model.config.vocab_size == json.loads((env_model / "config.json").read_text())["vocab_size"]

    later = tmp_path / "policy_000001"  # a later checkpoint of the same model, saved under another path
    shutil.copytree(warm_model_dir, later)
    conf = json.loads((later / "config.json").read_text())
    (later / "config.json").write_text(json.dumps({**conf, "_name_or_path": str(later), "transformers_version": "0"}))
    assert get_engine(cfg, str(later), get_chat(str(later), ChatConfig())) is warm

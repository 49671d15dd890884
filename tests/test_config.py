"""Config tree: YAML + overrides, errors that name the key, a docstring on every field."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from flows.config import ConfigError, RunConfig, load_config

TINY = "configs/tiny.yaml"
ROOT = Path(__file__).resolve().parents[1]


def test_tiny_yaml_loads_with_overrides():
    cfg = load_config(TINY, ["rollout.saar.similarity_threshold=0.7", "sandbox.timeout_s=2", "name=x"])
    assert cfg.rollout.saar.similarity_threshold == 0.7 and cfg.sandbox.timeout_s == 2.0 and cfg.name == "x"
    assert cfg.rollout.saar.max_tool_retries == 3 and cfg.rollout.saar.max_tool_rounds == 30


@pytest.mark.parametrize(
    "override, named",
    [
        ("rollout.saar.treshold=0.5", "rollout.saar.treshold: unknown key"),
        ("rollout.n_samples=many", "rollout.n_samples"),
        ("rollout.saar.raw_share=1.5", "rollout.saar.raw_share"),
        ("sandbox.backend=vm", "sandbox.backend"),
        ("nosuchsection.x=1", "nosuchsection: unknown key"),
    ],
)
def test_bad_override_names_the_key(override, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config(TINY, [override])


def test_bad_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout:\n  n_samples: [1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "none.yaml")
    with pytest.raises(ConfigError, match="expected key.path=value"):
        load_config(TINY, ["justakey"])


def _models(model: type[BaseModel], seen=None):
    seen = seen or set()
    if model in seen:
        return seen
    seen.add(model)
    for f in model.model_fields.values():
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
            _models(f.annotation, seen)
    return seen


def test_every_field_has_a_docstring():
    missing = [f"{m.__name__}.{name}" for m in _models(RunConfig) for name, f in m.model_fields.items()
               if not (f.description or "").strip()]
    assert missing == []


def test_config_hash_changes_with_values():
    assert load_config(TINY).hash() != load_config(TINY, ["seed=1"]).hash()


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")))
def test_every_committed_config_loads_and_its_model_exists_or_can_be_built(name):
    """A config with ``model.build: none`` (FrozenLake's) must point at a committed checkpoint."""
    cfg = load_config(ROOT / "configs" / name)
    if cfg.model.build == "none":
        assert (ROOT / cfg.model.path / "model.safetensors").is_file(), f"{name}: {cfg.model.path} is not committed"


def test_env_mode_refuses_a_chat_frame_it_would_ignore():
    """Environment mode writes RAGEN's prompt; a ``model.chat`` there would be silently dropped."""
    load_config("configs/frozen_lake.yaml")
    with pytest.raises(ConfigError, match=r"model.chat.system_prompt: environment mode writes RAGEN's own prompt"):
        load_config("configs/frozen_lake.yaml", ["model.chat.system_prompt=Think step by step."])
    assert load_config(TINY, ["model.chat.system_prompt=Think step by step."]).model.chat.system_prompt

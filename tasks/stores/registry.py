"""Checkpoints as MLflow logged models, and the model registry.

* ``log_checkpoint``: an evaluated checkpoint becomes a logged model of the run's experiment
  (transformers flavour, task ``text-generation``, with its tokenizer and chat template, so
  ``mlflow.transformers.load_model`` gives a pipeline that generates), recorded as an output of the
  run at its step; the caller logs its evaluation metrics with its ``model_id`` (and the held-out dataset).
  Idempotent: a checkpoint already logged (tag ``cleaner.checkpoint`` = ``<run id>:<version>``) is
  reused, so a rerun of the evaluation does not log it twice. Fenced (``tasks.stores.fence``): the weights are
  uploaded into a logged model of the attempt's own, which only the attempt holding the run makes READY (and an
  output of the run); a replaced attempt's stays PENDING, which nothing reads.
* ``register_run``: at the end of a run, its best checkpoint (by its held-out **score**: pass@1 for tool use,
  the success rate ``eval/<env>/success`` for an environment run; ``rank_metric``) and its final one
  are registered under the config's name, final last, so MLflow's reserved alias ``latest`` (the
  newest version) is the final checkpoint; the alias ``best`` moves to this run's best when it beats
  the version holding it (each version carries ``cleaner.score`` and ``cleaner.score_key`` as tags, and
  ``cleaner.pass_at_1`` when that is the score).
* ``wants_registration``: which runs register (``tracking.register_models``; by default those a deployment or a comparison
  started, not a run started from the shell), so smoke runs leave ``@latest`` where it was.
* ``resolve``: ``models:/<name>@best``, ``models:/<name>/3``, ``models:/<name>/latest`` or
  ``models:/m-…`` → a local checkpoint folder (downloaded once), for ``cleaner eval --model``.

Simplification: the checkpoint is copied as it is on disk (weights, config, tokenizer files, chat
template; not the optimizer state; a LoRA adapter merged into its base), with pinned pip requirements
instead of MLflow's inference (which would load the model in a subprocess).
"""

from __future__ import annotations

import os
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from tasks.stores import fence
from tasks.stores.config import TrackingConfig
from tasks.stores.locks import locked
from tasks.stores.tracking import named_errors

PASS_KEYS = ("eval/saar_off/all/pass_at_1", "eval/saar_on/all/pass_at_1")
"""The held-out pass@1 that ranks checkpoints: SAAR off (the policy on its own) when it was evaluated."""
SKIP_FILES = ("optimizer.pt", "trainer_state.json")
CHECKPOINT_TAG = "cleaner.checkpoint"


@dataclass(frozen=True)
class ModelRef:
    """Which logged model an evaluation belongs to: an existing one, or the checkpoint to log under ``name``."""

    name: str | None = None
    model_id: str | None = None


def _client(cfg: TrackingConfig):
    """A client of the configured store; also made MLflow's process-wide URI, because the sqlite registry
    resolves a version's ``models:/<id>`` source through the global tracking URI."""
    import mlflow
    from mlflow import MlflowClient

    if mlflow.get_tracking_uri() != cfg.mlflow_uri:
        mlflow.set_tracking_uri(cfg.mlflow_uri)
    return MlflowClient(tracking_uri=cfg.mlflow_uri, registry_uri=cfg.mlflow_uri)


def pass_at_1(metrics: dict[str, float]) -> float | None:
    return next((metrics[k] for k in PASS_KEYS if k in metrics), None)


def rank_metric(metrics: dict[str, float]) -> tuple[str, float] | None:
    """(key, value) that ranks a checkpoint: held-out pass@1 (``PASS_KEYS``), else an environment's held-out
    success rate (``eval/<env>/success``); None when the evaluation has neither."""
    key = next((k for k in PASS_KEYS if k in metrics), None)
    key = key or next((k for k in sorted(metrics) if k.startswith("eval/") and k.endswith("/success")
                       and k.count("/") == 2), None)
    return (key, metrics[key]) if key else None


def _stage(ckpt: Path, into: Path) -> Path:
    """The checkpoint's files minus optimizer state, hard-linked (copied across devices) into ``into``; a LoRA
    adapter is merged into its base first, so the logged model is a plain transformers model."""
    from models.lora import is_adapter, merge_adapter

    if is_adapter(ckpt):
        return merge_adapter(ckpt, into)
    into.mkdir(parents=True)
    for f in Path(ckpt).iterdir():
        if f.is_file() and f.name not in SKIP_FILES:
            try:
                os.link(f, into / f.name)
            except OSError:
                (into / f.name).write_bytes(f.read_bytes())
    return into


def _card(name: str, run_id: str, version: int, metrics: dict[str, float]):
    from huggingface_hub import ModelCard

    ranked = (rank_metric(metrics) or ("",))[0]
    rows = "\n".join(f"| {k} | {v:.4g} |" for k, v in sorted(metrics.items()) if "/all/" in k or k == ranked)
    return ModelCard(f"---\nlibrary_name: transformers\npipeline_tag: text-generation\n---\n# {name}, policy "
                     f"{version}\n\nCheckpoint of CLEANER run `{run_id}` after {version} RL steps.\n\n"
                     f"| held-out metric | value |\n|---|---|\n{rows}\n")


def _find(client, experiment_id: str, key: str):
    found = client.search_logged_models([experiment_id], filter_string=f"tags.`{CHECKPOINT_TAG}` = '{key}'")
    return next((m for m in found if str(m.status).endswith("READY")), None)


@named_errors
def log_checkpoint(cfg: TrackingConfig, mlrun: str, run_id: str, name: str, ckpt: Path, version: int,
                   metrics: dict[str, float]) -> str:
    """Log ``ckpt`` (policy ``version`` of our run ``run_id``) as a logged model (its pass@1 as a tag) and
    return its model id; the caller logs ``metrics`` with that id (``tracking.log_eval``)."""
    import mlflow.transformers
    import torch
    import transformers
    from mlflow.entities import LoggedModelOutput
    from mlflow.models import Model

    client = _client(cfg)
    experiment_id = client.get_run(mlrun).info.experiment_id
    key = f"{run_id}:{version:06d}"
    model = _find(client, experiment_id, key)
    if model is None:
        ranked, score = rank_metric(metrics) or (None, None)
        note = f"Policy {version} of CLEANER run `{run_id}` (config `{name}`)" + (
            f"; held-out {ranked} {score:.3f}." if score is not None else "; not evaluated.")
        tags = {CHECKPOINT_TAG: key, "cleaner.run_id": run_id, "cleaner.policy_version": str(version),
                "mlflow.note.content": note}
        if score is not None:
            tags.update({"cleaner.score": f"{score:.6g}", "cleaner.score_key": ranked})
            if ranked in PASS_KEYS:
                tags["cleaner.pass_at_1"] = f"{score:.6g}"
        model = client.create_logged_model(experiment_id, name=f"{name}-policy-{version:06d}", source_run_id=mlrun,
                                           tags=tags, params={"policy_version": str(version), "config": name},
                                           model_type="policy")
        with tempfile.TemporaryDirectory() as tmp:
            spec = Model(artifact_path=model.artifact_location, run_id=mlrun, model_id=model.model_id)
            mlflow.transformers.save_model(
                str(_stage(Path(ckpt), Path(tmp) / "checkpoint")), path=str(Path(tmp) / "model"), mlflow_model=spec,
                task="text-generation", model_card=_card(name, run_id, version, metrics),
                pip_requirements=[f"transformers=={transformers.__version__}", f"torch=={torch.__version__}"])
            client.log_model_artifacts(model.model_id, str(Path(tmp) / "model"))
        with fence.guarded_run(run_id):  # a replaced attempt's upload stays a PENDING model nothing finds
            client.log_outputs(mlrun, [LoggedModelOutput(model.model_id, step=version)])
            client.finalize_logged_model(model.model_id, "READY")
    return model.model_id


@named_errors
def run_models(cfg: TrackingConfig, mlrun: str, run_id: str) -> list:
    """The logged models of our run ``run_id``, oldest policy first."""
    client = _client(cfg)
    experiment_id = client.get_run(mlrun).info.experiment_id
    found = client.search_logged_models([experiment_id], filter_string=f"tags.`cleaner.run_id` = '{run_id}'")
    ready = [m for m in found if str(m.status).endswith("READY")]
    return sorted(ready, key=lambda m: int(m.tags.get("cleaner.policy_version", 0)))


def _score(model) -> float:
    """A logged model's or registered version's held-out score (``cleaner.pass_at_1`` on versions logged before
    ``cleaner.score`` existed); -inf when it was not evaluated."""
    value = model.tags.get("cleaner.score", model.tags.get("cleaner.pass_at_1"))
    return float(value) if value is not None else float("-inf")


def wants_registration(register: bool | None, deployment_id: str | None, parent: str | None) -> bool:
    """``tracking.register_models`` when set; else (None) whether a deployment (``deployment_id``) or a comparison
    (``parent``) started the run."""
    return register if register is not None else bool(deployment_id or parent)


NOT_REGISTERED = ("No model version registered: a run started from the shell leaves the registry alone "
                  "(`--set tracking.register_models=true` registers it); its evaluated checkpoints are logged models of "
                  "the run.")


def _version_of(client, name: str, model) -> str:
    """The registered version of ``model`` under ``name``, created when missing and recorded on the logged model
    (``mlflow.modelVersions``, as ``mlflow.register_model`` does without its "already exists" message)."""
    import json

    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

    for mv in client.search_model_versions(f"name = '{name}'"):
        if mv.tags.get("cleaner.model_id") == model.model_id:
            return str(mv.version)
    tags = {"cleaner.model_id": model.model_id, **{k: v for k, v in model.tags.items() if k.startswith("cleaner.")
                                                   and k != CHECKPOINT_TAG}}
    mv = client.create_model_version(name, f"models:/{model.model_id}", run_id=model.source_run_id, tags=tags,
                                     model_id=model.model_id)
    known = json.loads(client.get_logged_model(model.model_id).tags.get(MLFLOW_MODEL_VERSIONS, "[]"))
    client.set_logged_model_tags(model.model_id, {MLFLOW_MODEL_VERSIONS: json.dumps(
        [*known, {"name": mv.name, "version": mv.version}])})
    return str(mv.version)


@named_errors
def register_run(cfg: TrackingConfig, mlrun: str, run_id: str, name: str) -> dict[str, str]:
    """Register the run's best and final evaluated checkpoints under ``name``; returns {"final": v, "best": v, ...}.

    Only evaluated policies become model versions: a version says how good it is, and a run that evaluated nothing
    (``train.eval_every=0``, a smoke run) registers nothing — its final checkpoint stays a logged model of the run.
    "final" is then the last evaluated policy."""
    from mlflow.exceptions import MlflowException

    client = _client(cfg)
    models = [m for m in run_models(cfg, mlrun, run_id) if _score(m) > float("-inf")]
    if not models:
        return {}
    final = models[-1]
    best = max(models, key=lambda m: (_score(m), int(m.tags["cleaner.policy_version"])))
    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name, description=f"Policies trained by CLEANER with config `{name}`; "
                                       "`@best` = highest held-out score (pass@1, or an environment's success rate), "
                                       "`@latest` = the newest final checkpoint.")
    out = {}
    if best.model_id != final.model_id:
        out["run_best"] = _version_of(client, name, best)
    out["final"] = _version_of(client, name, final)
    out.setdefault("run_best", out["final"])
    with _alias_lock(cfg):
        try:
            holder = client.get_model_version_by_alias(name, "best")
            held = _score(holder)
        except MlflowException:
            holder, held = None, float("-inf")
        if holder is None or _score(best) > held:
            client.set_registered_model_alias(name, "best", out["run_best"])
        out["best"] = str(client.get_model_version_by_alias(name, "best").version)
    return out


def _alias_lock(cfg: TrackingConfig):
    """Runs that finish together (a compare's parallel runs) each read who holds ``@best`` and move it: under a
    lock beside a local sqlite registry, so that the read and the move are one step (MLflow's sqlite store inserts
    a new alias row unguarded: two movers at once fail with a UNIQUE constraint, and the later one could move the
    alias past a better version). Against a tracking server nothing is locked from here."""
    uri = cfg.mlflow_uri
    if not uri.startswith("sqlite:///"):
        return nullcontext()
    path = Path(uri.removeprefix("sqlite:///"))
    path.parent.mkdir(parents=True, exist_ok=True)
    return locked(Path(f"{path}.alias.lock"))


def model_id_of(mv) -> str:
    """The logged model behind a registered version (the sqlite registry leaves ``model_id`` empty; the
    source ``models:/<id>`` names it)."""
    return mv.model_id or mv.source.removeprefix("models:/")


def parse_uri(uri: str) -> tuple[str | None, str | None, str | None, str | None]:
    """``models:/…`` → (model id, registered name, version, alias); exactly one of id or name is set."""
    if not uri.startswith("models:/") or len(uri) <= len("models:/"):
        raise ValueError(f"{uri!r} is not a models:/ URI (models:/<name>@<alias>, models:/<name>/<version>, "
                         "models:/<name>/latest or models:/<model id>)")
    path = uri[len("models:/"):]
    if "/" in path:
        name, suffix = path.split("/", 1)
        return None, name, suffix, None
    if "@" in path:
        name, alias = path.rsplit("@", 1)
        return None, name, None, alias
    return path, None, None, None


@named_errors
def resolve(cfg: TrackingConfig, uri: str, cache_dir: Path) -> tuple[Path, str]:
    """A local checkpoint folder for a ``models:/`` URI, and its logged model id."""
    import mlflow.artifacts

    client = _client(cfg)
    model_id, name, version, alias = parse_uri(uri)
    if name is not None:
        if alias is not None:
            mv = client.get_model_version_by_alias(name, alias)
        elif version.lower() == "latest":
            mv = client.get_model_version_by_alias(name, "latest")
        else:
            mv = client.get_model_version(name, version)
        model_id = model_id_of(mv)
    dest = Path(cache_dir) / model_id
    if not (dest / "model" / "config.json").exists():
        mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{model_id}", dst_path=str(dest),
                                            tracking_uri=cfg.mlflow_uri, registry_uri=cfg.mlflow_uri)
    return dest / "model", model_id

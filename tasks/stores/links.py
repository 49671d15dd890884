"""Prefect ↔ MLflow: links both ways, the run description, and the flow run's artifacts.

* The MLflow run carries its Prefect flow run (tags ``prefect.flow_run_id`` / ``prefect.flow_run_url``)
  and a description (``mlflow.note.content``) summarising the run: config, arm, steps, final and best
  held-out pass@1, registered versions, and a link to the flow run.
* The flow run publishes Prefect artifacts: a link to its MLflow run, a progress artifact updated
  after every step, and a Markdown summary at the end.
* MLflow UI links open the model-training view (``?workflowType=machine_learning``: the MLflow 3.17 UI
  keeps the GenAI/training switch per browser, so a link must say which view it means).

URLs: the MLflow UI is ``tracking.ui_url``, else the tracking server, else ``http://127.0.0.1:5000``
(what ``mlflow ui`` serves); the Prefect UI is ``PREFECT_UI_URL``, else ``http://127.0.0.1:4200``
(``cleaner serve start`` serves the project's Prefect history, ``.prefect``, which every ``cleaner`` command uses
unless ``PREFECT_HOME`` is set, so the runs of ephemeral mode open there too).
"""

from __future__ import annotations

import re

from tasks.stores.config import TrackingConfig
from tasks.stores.tracking import named_errors

VIEW = "workflowType=machine_learning"
PREFECT_UI = "http://127.0.0.1:4200"


def mlflow_ui(cfg: TrackingConfig) -> str:
    if cfg.ui_url:
        return cfg.ui_url.rstrip("/")
    if cfg.mlflow_uri.startswith(("http://", "https://")):
        return cfg.mlflow_uri.rstrip("/")
    return "http://127.0.0.1:5000"


def experiment_url(cfg: TrackingConfig, experiment_id: str) -> str:
    return f"{mlflow_ui(cfg)}/#/experiments/{experiment_id}/runs?{VIEW}"


def run_url(cfg: TrackingConfig, experiment_id: str, mlrun: str) -> str:
    return f"{mlflow_ui(cfg)}/#/experiments/{experiment_id}/runs/{mlrun}?{VIEW}"


def model_url(cfg: TrackingConfig, name: str) -> str:
    return f"{mlflow_ui(cfg)}/#/models/{name}?{VIEW}"


def flow_run_url(flow_run_id: str | None) -> str | None:
    if not flow_run_id:
        return None
    from prefect.settings import PREFECT_UI_URL

    return f"{(PREFECT_UI_URL.value() or PREFECT_UI).rstrip('/')}/flow-runs/flow-run/{flow_run_id}"


def artifact_key(name: str, what: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) for config ``name``."""
    return re.sub(r"[^a-z0-9]+", "-", f"{name}-{what}".lower()).strip("-")


def describe(run_id: str, config_name: str, arm: str, steps: int, flow_run: str | None,
             evals: dict[int, float] | None = None, registered: dict[str, str] | None = None,
             parent: str | None = None, not_registered: str | None = None) -> str:
    """The Markdown description of a training run (``evals``: policy version → held-out pass@1; ``not_registered``:
    why a run that evaluated policies registered none)."""
    lines = [f"**CLEANER run `{run_id}`**: config `{config_name}`, arm **{arm}**, {steps} RL steps."]
    if evals:
        last = max(evals)
        best = max(evals, key=lambda v: (evals[v], v))
        lines.append(f"Held-out pass@1 (SAAR off): final **{evals[last]:.3f}** (policy {last}); best "
                     f"**{evals[best]:.3f}** (policy {best}); all: "
                     + ", ".join(f"{v}: {p:.3f}" for v, p in sorted(evals.items())) + ".")
    if registered:
        own_best = registered["run_best"] != registered["final"]
        lines.append(f"Registered as `{config_name}` version {registered['final']} (final, `@latest`)"
                     + (f" and {registered['run_best']} (this run's best)" if own_best else "")
                     + f"; `@best` is version {registered['best']}.")
    elif not_registered:
        lines.append(not_registered)
    elif registered is not None:
        lines.append("No model version registered: the run evaluated no policy (`train.eval_every`); its final "
                     "checkpoint is a logged model of the run.")
    if parent:
        lines.append(f"Part of comparison `{parent}` (the parent run).")
    url = flow_run_url(flow_run)
    lines.append(f"Prefect flow run: [{flow_run}]({url})." if url else "Not started by a Prefect flow run.")
    lines.append("Trajectories of every step are traces (Traces tab; filter `tags.rollback = 'true'`, "
                 "`tags.step = '3'`); evaluated checkpoints are logged models (Models tab).")
    return "\n\n".join(lines)


def describe_compare(compare_id: str, config_name: str, summary: dict | None, seeds: list[int],
                     arms: list[str] | None = None) -> str:
    """The description of a comparison's parent run: arms, seeds and, once done, final pass@1 per arm."""
    arms = arms or list((summary or {}).get("final", {}))
    lines = [(f"**Comparison `{compare_id}`**: config `{config_name}`, arms {', '.join(f'**{a}**' for a in arms)}, "
              f"seeds {', '.join(map(str, seeds))}; one child run per arm and seed (expand this run in the runs "
              "table).")]
    if summary:
        rows = [f"| {arm} | {f['pass_at_1']:.3f} ± {f['pass_at_1_std']:.3f} |" for arm, f in summary["final"].items()
                if f["pass_at_1"] is not None]
        lines.append("| arm | final held-out pass@1 (mean ± std over seeds) |\n|---|---|\n" + "\n".join(rows))
        lines.append(f"Steps to the baseline's final pass@1: {summary['steps_to_baseline_final']}. "
                     "Report: the `report/` artifacts.")
    return "\n\n".join(lines)


def pass_by_version(rows: list[dict]) -> dict[int, float]:
    """Evaluation rows (policy_version, key, value) → policy version → held-out pass@1, SAAR off preferred."""
    out: dict[int, float] = {}
    for r in sorted(rows, key=lambda r: r["key"] != "eval/saar_off/all/pass_at_1"):
        out.setdefault(int(r["policy_version"]), float(r["value"]))
    return out


@named_errors
def set_description(cfg: TrackingConfig, mlrun: str, text: str) -> None:
    from mlflow import MlflowClient

    MlflowClient(tracking_uri=cfg.mlflow_uri).set_tag(mlrun, "mlflow.note.content", text)


@named_errors
def experiment_of(cfg: TrackingConfig, mlrun: str) -> str:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=cfg.mlflow_uri).get_run(mlrun).info.experiment_id


@named_errors
def annotate_run(cfg: TrackingConfig, mlrun: str, prompt_sets: dict[str, str], description: str,
                 flow_run_id: str | None) -> str:
    """Dataset inputs, description and Prefect tags of a run; returns its MLflow UI URL."""
    from mlflow import MlflowClient
    from mlflow.entities import RunTag

    from tasks.stores.datasets import log_prompt_sets

    log_prompt_sets(cfg, mlrun, prompt_sets)
    tags = [RunTag("mlflow.note.content", description)]
    if url := flow_run_url(flow_run_id):
        tags += [RunTag("prefect.flow_run_id", flow_run_id), RunTag("prefect.flow_run_url", url)]
    MlflowClient(tracking_uri=cfg.mlflow_uri).log_batch(mlrun, tags=tags)
    return run_url(cfg, experiment_of(cfg, mlrun), mlrun)


def summary_markdown(description: str, mlflow_link: str, plot: str) -> str:
    """The flow run's closing Markdown artifact: the run description, where to look, the summary plot's path."""
    return (f"# Training run summary\n\n{description}\n\n[Open the MLflow run]({mlflow_link}) (model-training view)."
            f"\n\nSummary plot: `{plot}` (also the run's `plots/summary.png` artifact).\n")


class FlowArtifacts:
    """The Prefect artifacts of one training flow run (no-ops outside a flow run)."""

    def __init__(self, config_name: str, steps: int):
        self.name, self.steps = config_name, steps
        self.progress_id = None

    @staticmethod
    def _active() -> bool:
        from prefect.context import FlowRunContext

        return FlowRunContext.get() is not None

    def start(self, mlflow_link: str, run_id: str) -> None:
        if not self._active():
            return
        from prefect.artifacts import create_link_artifact, create_progress_artifact

        create_link_artifact(mlflow_link, link_text=f"MLflow run {run_id}", key=artifact_key(self.name, "mlflow-run"),
                             description=f"The MLflow run of training run `{run_id}` (model-training view).")
        self.progress_id = create_progress_artifact(0.0, key=artifact_key(self.name, "progress"),
                                                    description=f"Steps of `{run_id}` done (of {self.steps}).")

    def step_done(self, step: int, summary: str) -> None:
        if self.progress_id is None:
            return
        from prefect.artifacts import update_progress_artifact

        update_progress_artifact(self.progress_id, 100.0 * (step + 1) / max(1, self.steps),
                                 description=f"Step {step + 1} of {self.steps} done: {summary}")

    def finish(self, markdown: str) -> None:
        if not self._active():
            return
        from prefect.artifacts import create_markdown_artifact

        create_markdown_artifact(markdown, key=artifact_key(self.name, "summary"), description="Training run summary")

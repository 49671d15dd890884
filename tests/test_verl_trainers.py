"""CLEANER's agent loop under verl's own trainers — V1 (verl's default) and legacy — through real Ray actors on CPU.

Each trainer runs the paper's config (``configs/verl/cleaner_grpo.yaml``, only ``trainer.use_v1`` differs) from a
verl parquet to its first rollout and back (``tests/verl_trainers.py`` says what is verl's and what stands in):
two prompts, ``rollout.n = 2``, half the draws raw. Every row must equal its hand-built golden
(``tests/test_verl_agent_loop.py``'s goldens: the paper's wrapper on the prompt, SAAR's splice or the raw error in
the response, the masks and log-probs), its raw draw must be the pipeline's ``is_raw(seed, step, prompt id, sample
index)`` with the pipeline's prompt id, and the server's ``global_steps`` and the loop's timings must reach the
trainer. One Ray session serves both trainers.
"""

from __future__ import annotations

import pytest

from sandbox.base import make_sandbox
from sandbox.config import SandboxConfig
from tasks.data.prompts import NO_UNITS
from tasks.rollout.saar import is_raw

verl = pytest.importorskip("verl", reason="verl is not installed: pip install -e '.[verl]' (CPU is fine)")
pytestmark = [pytest.mark.verl, pytest.mark.slow]

from tests.test_verl_agent_loop import SCRIPTS, golden  # noqa: E402  (needs verl)
from tests.verl_trainers import SERVER_STEP, ScriptClient, compose, run_legacy, run_v1, start_ray, write_rows  # noqa: E402

CASES = ("fix_a", "clean")
RAW_SHARE, STEP, N = 0.5, 1, 2
SOURCE = "math_dapo"  # the paper's wrapper appends its no-units rule to these prompts


def pick_seed() -> int:
    """A seed whose step-1 draws split the fix prompt's two samples (one raw, one SAAR)."""
    for seed in range(1000):
        if len({is_raw(seed, STEP, f"{SOURCE}/0", s, RAW_SHARE) for s in range(N)}) == 2:
            return seed
    raise AssertionError("no seed fits")


SEED = pick_seed()


def question(case: str) -> str:
    return f"case {case}: what is 6 * 7?"


@pytest.fixture(scope="session")
def ray_session():
    import ray

    start_ray()
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory):
    rows = [{"data_source": SOURCE, "prompt": [{"role": "user", "content": question(c)}], "ability": "math",
             "reward_model": {"ground_truth": "42", "style": "rule"}, "extra_info": {"index": i}}
            for i, c in enumerate(CASES)]
    return write_rows(tmp_path_factory.mktemp("verl") / "train.parquet", rows)


def config(warm_model_dir, rows_file, *trainer: str):
    """The paper's config for these rows; ``trainer`` overrides (none: verl's default trainer, V1)."""
    return compose(warm_model_dir, rows_file, f"cleaner.seed={SEED}", f"cleaner.saar.raw_share={RAW_SHARE}", *trainer)


def v1_rows(out: dict) -> list[dict]:
    """The replay buffer's rows as plain values: ``index``, ``session_id``, ids, masks, log-probs, fields, tags."""
    data, rows = out["data"], []
    for i, tag in enumerate(out["tags"]):
        rows.append({"index": int(data["index"][i]), "sample": int(data["session_id"][i]),
                     "prompt": data["prompts"][i].tolist(), "response": data["responses"][i].tolist(),
                     "mask": data["response_mask"][i].tolist(), "lps": data["rollout_log_probs"][i].tolist(),
                     "extra": dict(data["extra_fields"][i]), "metrics": dict(data["metrics"][i]), "tag": tag})
    return rows


def legacy_rows(out) -> list[dict]:
    """The legacy ``DataProto`` rows, padding removed, as the same plain values."""
    width, rows = out.batch["prompts"].shape[1], []
    for i in range(len(out)):
        attn = out.batch["attention_mask"][i]
        n = int(attn[width:].sum())
        extra = {k: out.non_tensor_batch[k][i] for k in ("cleaner_raw", "min_global_steps", "max_global_steps")}
        rows.append({"index": int(out.non_tensor_batch["index"][i]),
                     "sample": int(out.non_tensor_batch["cleaner_draw"][i]["sample"]),
                     "prompt": out.batch["prompts"][i][attn[:width].bool()].tolist(),
                     "response": out.batch["responses"][i][:n].tolist(),
                     "mask": out.batch["response_mask"][i][:n].tolist(),
                     "lps": out.batch["rollout_log_probs"][i][:n].tolist(), "extra": extra})
    return rows


@pytest.fixture(scope="module")
def v1(ray_session, warm_model_dir, rows_file):
    cfg = config(warm_model_dir, rows_file)
    assert cfg.trainer.use_v1 is True  # verl's default, which the paper config keeps
    out = run_v1(cfg, ScriptClient(warm_model_dir, SCRIPTS))
    return {"manager": out["manager"], "rows": v1_rows(out)}


@pytest.fixture(scope="module")
def legacy(ray_session, warm_model_dir, rows_file):
    manager, out = run_legacy(config(warm_model_dir, rows_file, "trainer.use_v1=false"),
                              ScriptClient(warm_model_dir, SCRIPTS))
    return {"manager": manager, "out": out, "rows": legacy_rows(out)}


@pytest.fixture(scope="module")
def goldens(chat):
    with make_sandbox(SandboxConfig(backend="local", workers=1)) as box:
        return {(c, raw): golden(chat, box, c, raw, 256) for c in CASES for raw in (False, True)}


def check_rows(rows: list[dict], goldens, chat) -> None:
    assert sorted((r["index"], r["sample"]) for r in rows) == [(i, s) for i in range(len(CASES)) for s in range(N)]
    for r in rows:
        case = CASES[r["index"]]
        raw = is_raw(SEED, STEP, f"{SOURCE}/{r['index']}", r["sample"], RAW_SHARE)
        assert bool(r["extra"]["cleaner_raw"]) == raw, (case, r["sample"])
        g = goldens[(case, raw)]
        assert r["prompt"] == chat.prompt_ids([{"role": "user", "content": question(case) + NO_UNITS}]), case
        assert (chat.decode(r["response"]), r["mask"]) == (chat.decode(g.ids), g.mask), (case, raw)
        assert r["response"] == g.ids and r["lps"] == pytest.approx(g.lps, abs=1e-6), (case, raw)
    fix = [bool(r["extra"]["cleaner_raw"]) for r in rows if CASES[r["index"]] == "fix_a"]
    assert sorted(fix) == [False, True]


def test_v1_rows_masks_and_draws(v1, goldens, chat):
    check_rows(v1["rows"], goldens, chat)


def test_legacy_rows_masks_and_draws(legacy, goldens, chat):
    check_rows(legacy["rows"], goldens, chat)


def test_each_trainer_gets_its_manager_from_the_same_config(v1, legacy):
    """``agent_loop_manager_class`` names one class; its ``create`` builds V1's TransferQueue manager under V1."""
    from verl.trainer.ppo.v1 import AgentLoopManagerTQ

    from tasks.training.verl_loop import CleanerAgentLoopManager
    from tasks.training.verl_v1 import CleanerAgentLoopManagerTQ

    assert type(v1["manager"]) is CleanerAgentLoopManagerTQ and isinstance(v1["manager"], AgentLoopManagerTQ)
    assert type(legacy["manager"]) is CleanerAgentLoopManager
    assert all(r["tag"]["global_steps"] == STEP for r in v1["rows"])


def test_the_servers_weight_version_reaches_the_trainer(v1, legacy):
    """V1 tags each row with the min/max weight versions its turns were generated with (off-policy staleness):
    they come from the server's ``TokenOutput.extra_fields``."""
    assert all(r["tag"]["min_global_steps"] == r["tag"]["max_global_steps"] == SERVER_STEP for r in v1["rows"])
    assert all(r["extra"]["min_global_steps"] == SERVER_STEP for r in legacy["rows"])


def test_the_loops_timings_reach_verls_metrics(v1, legacy):
    """Seconds in the server and in the sandbox, per row (V1) and in the legacy trainer's timing table."""
    assert all(r["metrics"]["generate_sequences"] > 0 and r["metrics"]["tool_calls"] > 0 for r in v1["rows"])
    timing = legacy["out"].meta_info["timing"]
    assert timing["agent_loop/generate_sequences/min"] > 0 and timing["agent_loop/tool_calls/min"] > 0

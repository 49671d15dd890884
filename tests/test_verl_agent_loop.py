"""Parity: the verl agent loop ``cleaner_agent`` and the pipeline's ``Rollout`` give the same trajectories.

The same rows, one verl parquet file, go through both paths: the pipeline's loader
(``tasks.data.loader.load_prompts``) and verl's own dataset (``RLHFDataset``, the trainers' collate), so the
paper's prompt wrapper and the raw-share draw's prompt id must come out the same. verl's real
``AgentLoopWorker`` (config composed from verl's own ``ppo_trainer.yaml``, our loop
registered through ``configs/verl/agent_loops.yaml``) runs the batch through
``generate_sequences``; its server manager and the pipeline's engine answer from the same
per-prompt scripts (real tokenizer, real end-of-turn id), and code runs in the local sandbox on
both sides. (``tests/test_verl_trainers.py`` drives verl's trainers themselves, V1 and legacy, through Ray.) Prompt ids, response ids, response masks, rollout log-probs and the SAAR decisions
must be identical, scenario by scenario — with half the samples drawn raw, and with the servers'
awkward stops: a turn ending on ``<|endoftext|>`` (SGLang ``stop``), a turn the server cut short
(``length`` below ``max_new_tokens``) and vLLM's ``completed`` for both. No token the policy did
not sample is ever trained (mask 1).

Parity alone cannot catch a SAAR bug both sides share, so every scenario also has a **golden** trajectory
built by hand from DESIGN §3 — turn ids from the tokenizer, tool texts from the sandbox, splices and notes
written out here, nothing from ``tasks.rollout`` — and both paths must equal it (a shallow splice that lost
the old reasoning fails here).

Over ~400 lines on purpose: one scenario table, the two scripted servers and the parity check belong
together (split, each part would need the others to be read).
"""

from __future__ import annotations

import asyncio
import os
import re

import pandas as pd
import pytest

from models.chat import render_call
from models.engine import GenOutput, GenRequest
from sandbox.base import make_sandbox
from sandbox.config import SandboxConfig
from tasks.data.loader import load_prompts
from tasks.data.prompts import NO_UNITS
from tasks.rollout.machine import Rollout
from tasks.rollout.saar import is_raw
from tasks.rollout.types import PromptItem
from tests.scripted import Turn, scripted_turn
from tests.test_saar_rollout import LONG_FIX

verl = pytest.importorskip("verl", reason="verl is not installed: pip install -e '.[verl]' (CPU is fine)")
pytestmark = [pytest.mark.verl, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = ["Go. " + render_call("pritn(6 * 7)"), "Go. " + render_call("print(6 * 7)"), "\\boxed{42}"]
SCRIPTS = {
    "shallow": ["I multiply. " + render_call("pritn(6 * 7)"), "Fixing. " + render_call("print(6 * 7)"), "\\boxed{42}"],
    "deep": ["Go. " + render_call("print(6 * 7"), "A loop instead. " + render_call(LONG_FIX), "\\boxed{56088}"],
    "exhausted": [f"T{i}. " + render_call(f"print(1/0 + {i})") for i in range(4)] + ["I give up."],
    "no_call": ["Compute. " + render_call("print(undefined_name)"), "It is \\boxed{42}."],
    "clean": ["Easy. " + render_call("print(40 + 2)"), "\\boxed{42}"],
    "endoftext": [Turn("Easy. " + render_call("print(40 + 2)"), "endoftext"), Turn("\\boxed{42}", "endoftext")],
    "cut": [Turn("Let me think about it. " * 4, "length")],
    "vllm": [Turn("Easy. " + render_call("print(6 * 7)"), "endoftext"), Turn("\\boxed{42} and then", "length")],
    "malformed": ["Go. " + render_call("print(6 * 7)")[: -len("}</tool_call>")] + "</tool_call>",
                  "Go. " + render_call("print(6 * 7)"), "\\boxed{42}"],
    "fix_a": FIX, "fix_b": FIX, "fix_c": FIX, "fix_d": FIX,
    "long": ["Print. " + render_call("print('A' * 300 + 'B' * 300)"), "\\boxed{0}"],
}
SAAR_CASES = ("shallow", "deep", "exhausted", "no_call", "malformed")
FIX_CASES = ("fix_a", "fix_b", "fix_c", "fix_d")
RAW_SHARE = 0.5
SOURCE = "math_dapo"  # the paper's wrapper appends its no-units rule to these prompts
SERVER_STEP = 3
"""The weights version the scripted server reports on a trajectory's first turn (one more on each later turn)."""


def pid(case: str) -> str:
    """The pipeline's prompt id of a case's row (``{data_source}/{extra_info.index}``): the raw draw's key."""
    return f"{SOURCE}/{case}"


def question(case: str) -> str:
    return f"case {case}: what is 6 * 7?"


def pick_step() -> int:
    """A step whose draws leave the SAAR scenarios on and draw some, not all, fix cases raw."""
    for step in range(1, 1000):
        raw = {c: is_raw(0, step, pid(c), 0, RAW_SHARE) for c in SCRIPTS}
        if not any(raw[c] for c in SAAR_CASES) and 0 < sum(raw[c] for c in FIX_CASES) < len(FIX_CASES):
            return step
    raise AssertionError("no step fits")


STEP = pick_step()


def server_reason(case: str, finish: str, ids: list[int], max_new_tokens: int) -> str:
    """The stop reason a server reports: vLLM says ``completed`` for stops and cuts alike, SGLang
    ``stop`` / ``length``; a cut turn is shorter than its budget (the server clamped it)."""
    assert finish == "stop" or len(ids) < max_new_tokens
    return "completed" if case == "vllm" else finish


class KeyedScript:
    """Answers a request from the script of the case named in its prompt (``case <name>``)."""

    def __init__(self, chat):
        self.chat = chat
        self.left = {k: list(v) for k, v in SCRIPTS.items()}

    def answer(self, input_ids: list[int]) -> tuple[str, list[int], list[float], str]:
        case = re.search(r"case (\w+)", self.chat.decode(input_ids)).group(1)
        ids, lps, finish = scripted_turn(self.chat, self.left[case].pop(0), -0.001 * (len(self.left[case]) + 1))
        return case, ids, lps, finish


class ScriptEngine:
    def __init__(self, script: KeyedScript):
        self.script, self.eos_id = script, script.chat.eos_id

    def generate(self, requests, seed):
        return [GenOutput(*self.script.answer(r.input_ids)[1:]) for r in requests]

    def load_weights(self, path):
        return None


class ScriptServerManager:
    """Stands in for verl's ``LLMServerClient`` (same ``generate`` signature, returns ``TokenOutput``)."""

    def __init__(self, script: KeyedScript):
        self.script = script
        self.params: list[dict] = []
        self.turns: dict[str, int] = {}

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        assert sampling_params["logprobs"] and sampling_params["max_new_tokens"] >= 1
        self.params.append(dict(sampling_params))
        case, ids, lps, finish = self.script.answer(prompt_ids)
        reason = server_reason(case, finish, ids, sampling_params["max_new_tokens"])
        version = SERVER_STEP + self.turns.get(request_id, 0)  # as verl's client tags it: min = max = the server's
        self.turns[request_id] = self.turns.get(request_id, 0) + 1
        fields = {"global_steps": version, "min_global_steps": version, "max_global_steps": version}
        return TokenOutput(token_ids=ids, log_probs=lps, stop_reason=reason, extra_fields=fields)


def write_rows(path, rows: list[dict]):
    pd.DataFrame(rows).to_parquet(path)
    return path


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory):
    """Every case as one verl RL row; both paths read this file."""
    rows = [{"data_source": SOURCE, "prompt": [{"role": "user", "content": question(c)}], "ability": "math",
             "reward_model": {"ground_truth": "42", "style": "rule"}, "extra_info": {"index": c}} for c in SCRIPTS]
    return write_rows(tmp_path_factory.mktemp("verl_rows") / "rows.parquet", rows)


def dataset_rows(config, path, tokenizer) -> list[dict]:
    """The rows of ``path`` as verl's own dataset reads them (``data.*`` of ``config``)."""
    from verl.trainer.ppo.utils import create_rl_dataset

    dataset = create_rl_dataset(str(path), config.data, tokenizer, None, is_train=True)
    return [dataset[i] for i in range(len(dataset))]


@pytest.fixture(scope="module")
def verl_rows(verl_config, rows_file, tokenizer) -> dict:
    return {row["extra_info"]["index"]: row for row in dataset_rows(verl_config, rows_file, tokenizer)}


def verl_overrides(model_dir, *extra: str) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.rollout.name=sglang",
        "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4",
        "actor_rollout_ref.rollout.prompt_length=1024", "actor_rollout_ref.rollout.response_length=512",
        "actor_rollout_ref.rollout.agent.default_agent_loop=cleaner_agent",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={ROOT}/configs/verl/agent_loops.yaml",
        f"+cleaner.saar.raw_share={RAW_SHARE}", "+cleaner.max_new_tokens=128",
        "+cleaner.sandbox.backend=local", "+cleaner.sandbox.workers=1", *extra,
    ]


def compose_verl(model_dir, *extra: str):
    import verl.trainer.config as verl_configs
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=os.path.dirname(verl_configs.__file__), version_base=None):
        return compose(config_name="ppo_trainer", overrides=verl_overrides(model_dir, *extra))


@pytest.fixture(scope="module")
def verl_config(warm_model_dir):
    return compose_verl(warm_model_dir)


def verl_batch(rows: dict, cases: list[str], step: int, validate: bool = False):
    """A legacy trainer's batch of these cases' dataset rows (its collate), tagged as our manager tags it."""
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import collate_fn

    from tasks.training.verl_draws import annotate_draws

    batch = DataProto.from_single_dict(collate_fn([rows[c] for c in cases]),
                                       meta_info={"global_steps": step, "validate": validate})
    annotate_draws(batch)  # what CleanerAgentLoopManager does before verl splits the batch over workers
    return batch


def run_verl(config, chat, batch):
    import torch
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    from tasks.training.verl_loop import close_sandboxes

    torch.set_num_threads(1)
    manager = ScriptServerManager(KeyedScript(chat))
    worker = AgentLoopWorker(config, manager)
    try:
        return asyncio.run(worker.generate_sequences(batch)), manager
    finally:
        close_sandboxes()


@pytest.fixture(scope="module")
def both_paths(verl_config, verl_rows, rows_file, chat):
    from tasks.training.verl_loop import rollout_config

    cases = list(SCRIPTS)
    cfg = rollout_config(verl_config)
    items = {item.prompt_id: item for item in load_prompts(str(rows_file))}
    with make_sandbox(SandboxConfig(backend="local", workers=1)) as box:
        pipeline = Rollout(cfg, ScriptEngine(KeyedScript(chat)), chat, box).run([items[pid(c)] for c in cases], 0,
                                                                               STEP, False)
    out, manager = run_verl(verl_config, chat, verl_batch(verl_rows, cases, STEP))
    return cases, cfg, pipeline, out, manager


def unpadded(out, row: int) -> tuple[list[int], list[int], list[int], list[float]]:
    width = out.batch["prompts"].shape[1]
    attn = out.batch["attention_mask"][row]
    prompt = out.batch["prompts"][row][attn[:width].bool()].tolist()
    n = int(attn[width:].sum())
    resp = out.batch["responses"][row][:n].tolist()
    mask = out.batch["response_mask"][row][:n].tolist()
    lps = out.batch["rollout_log_probs"][row][:n].tolist()
    return prompt, resp, mask, lps


def test_verl_keys_configure_our_rollout(both_paths):
    _, cfg, _, _, _ = both_paths
    assert cfg.max_turns == 4 and cfg.max_response_tokens == 512 and cfg.max_new_tokens == 128
    assert cfg.saar.raw_share == RAW_SHARE and cfg.saar.similarity_threshold == 0.5


def test_same_tokens_masks_and_logprobs(both_paths):
    cases, _, pipeline, out, _ = both_paths
    for row, (case, traj) in enumerate(zip(cases, pipeline)):
        prompt, resp, mask, lps = unpadded(out, row)
        assert prompt == traj.prompt_ids, case
        assert resp == traj.response_ids, case
        assert mask == traj.response_mask, case
        assert lps == pytest.approx(traj.logprobs, abs=1e-6), case


def test_same_raw_draws_keyed_by_step_and_sample(both_paths):
    cases, _, pipeline, out, _ = both_paths
    raw = [bool(r) for r in out.non_tensor_batch["cleaner_raw"]]
    assert raw == [t.raw for t in pipeline] == [is_raw(0, STEP, pid(c), 0, RAW_SHARE) for c in cases]
    assert 0 < sum(raw[cases.index(c)] for c in FIX_CASES) < len(FIX_CASES)


def test_same_saar_decisions(both_paths):
    cases, _, pipeline, out, _ = both_paths
    seen = set()
    for row, (case, traj) in enumerate(zip(cases, pipeline)):
        events = out.non_tensor_batch["cleaner_events"][row]
        assert [(e["kind"], e["similarity"]) for e in events] == [(e.kind, e.similarity) for e in traj.events], case
        stats = out.non_tensor_batch["cleaner_stats"][row]
        assert {k: stats[k] for k in traj.stats.scalars()} == traj.stats.scalars(), case
        seen.update(e.kind for e in traj.events)
    assert {"shallow", "deep", "recovered", "exhausted", "no_call"} <= seen


def test_raw_fix_keeps_its_error_and_saar_fix_is_purified(both_paths, chat):
    cases, _, _, out, _ = both_paths
    for case in FIX_CASES:
        row = cases.index(case)
        text = chat.decode(unpadded(out, row)[1])
        if out.non_tensor_batch["cleaner_raw"][row]:
            assert "NameError" in text and text.count("<tool_call>") == 2, case
        else:
            assert "Error" not in text and "pritn" not in text and text.count("<tool_call>") == 1, case


def test_purified_trajectories_carry_no_error_text(both_paths, chat):
    cases, _, _, out, _ = both_paths
    for row, case in enumerate(cases):
        text = chat.decode(unpadded(out, row)[1])
        if case in ("shallow", "deep", "clean"):
            assert "Error" not in text and text.count("<tool_call>") == 1, case


def test_no_token_the_policy_did_not_sample_is_trained(both_paths, chat):
    """Every mask-1 token carries a sampled (non-zero) log-prob; a turn ended on <|endoftext|> is closed
    by an <|im_end|> with mask 0; a cut turn is not closed at all."""
    cases, _, _, out, _ = both_paths
    eot = chat.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    for row, case in enumerate(cases):
        _, resp, mask, lps = unpadded(out, row)
        assert all(lp != 0.0 for m, lp in zip(mask, lps) if m == 1), case
    for case in ("endoftext", "vllm"):
        _, resp, mask, _ = unpadded(out, cases.index(case))
        first = resp.index(eot)
        assert mask[first] == 1 and resp[first + 1] == chat.eos_id and mask[first + 1] == 0, case
    _, resp, mask, _ = unpadded(out, cases.index("cut"))
    assert resp == chat.encode("Let me think about it. " * 4) and set(mask) == {1}
    finish = dict(zip(cases, out.non_tensor_batch["cleaner_finish_reason"]))
    assert (finish["cut"], finish["vllm"], finish["endoftext"]) == ("length", "length", "stop")


def test_servers_are_asked_to_stop_on_every_end_id(both_paths, chat):
    *_, manager = both_paths
    eot = chat.tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert all(set(p["stop_token_ids"]) == {chat.eos_id, eot} for p in manager.params)


@pytest.mark.parametrize("source", ["math_dapo", "openai/gsm8k", "code_contests", "synthetic/arith"])
def test_a_verl_row_becomes_the_pipelines_item(source, verl_config, tokenizer, tmp_path):
    """``prompt_item`` of a row verl's dataset read = ``load_prompts``' item of the same row: the id the raw draw is
    keyed on (``{data_source}/{extra_info.index}``), the paper's wrapper by source (none on synthetic rows), the
    ground truth and extra info."""
    from tasks.data.prompts import AGENT_NOTE, MATH_INTRO
    from tasks.training.verl_loop import prompt_item

    rows = [{"data_source": source, "prompt": [{"role": "user", "content": "What is 6 * 7?"}], "ability": "math",
             "reward_model": {"ground_truth": "42", "style": "rule"}, "extra_info": {"index": 7, "split": "train"}}]
    path = write_rows(tmp_path / "one.parquet", rows)
    item = prompt_item(dataset_rows(verl_config, path, tokenizer)[0])
    assert item == load_prompts(str(path))[0]
    assert item.prompt_id == f"{source}/7" and item.extra_info == {"index": 7, "split": "train"}
    content = item.messages[-1]["content"]
    wrapped = {"math_dapo": content == "What is 6 * 7?" + NO_UNITS, "code_contests": AGENT_NOTE in content,
               "openai/gsm8k": content.startswith(MATH_INTRO + "What is 6 * 7?"),
               "synthetic/arith": content == "What is 6 * 7?"}
    assert wrapped[source] and prompt_item(dataset_rows(verl_config, path, tokenizer)[0], template=False).messages == \
        [{"role": "user", "content": "What is 6 * 7?"}]


def test_a_row_whose_prompt_is_final_is_not_wrapped_again(verl_config, tokenizer, tmp_path):
    """A row ``cleaner data to-verl`` wrote from another format (its loader made the prompt, ``FINAL_PROMPT``): the
    verl loop uses it as written, as the pipeline's loader does — a second wrapper would change every token."""
    from tasks.data.formats import FINAL_PROMPT
    from tasks.training.verl_loop import prompt_item

    extra = {"index": 3, FINAL_PROMPT: True}
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "Wrapped already: 6 * 7?"}],
             "ability": "math", "reward_model": {"ground_truth": "42", "style": "rule"}, "extra_info": extra}]
    path = write_rows(tmp_path / "final.parquet", rows)
    item = prompt_item(dataset_rows(verl_config, path, tokenizer)[0])
    assert item.messages == [{"role": "user", "content": "Wrapped already: 6 * 7?"}]
    assert item == load_prompts(str(path))[0]


def test_a_verl_row_without_an_id_is_an_error_naming_it():
    from tasks.training.verl_loop import prompt_item

    row = {"data_source": "math_dapo", "uid": "u-1", "raw_prompt": [{"role": "user", "content": "6 * 7?"}]}
    with pytest.raises(ValueError, match="data_source 'math_dapo' \\(uid 'u-1'\\) has no id: give it extra_info.index"):
        prompt_item(row)


def test_the_loops_timings_fill_verls_metrics(both_paths):
    """``AgentLoopMetrics``: seconds waiting on the server (every row) and in the sandbox (rows that ran code);
    verl's ``agent_loop/generate_sequences/*`` and ``tool_calls/*`` timings are made from these."""
    cases, *_ = both_paths
    out = both_paths[3]
    metrics = dict(zip(cases, out.meta_info["metrics"]))
    assert all(m["generate_sequences"] > 0 for m in metrics.values())
    assert all(m["tool_calls"] > 0 for c, m in metrics.items() if c != "cut") and metrics["cut"]["tool_calls"] == 0


def test_the_servers_extra_fields_reach_verl(both_paths):
    """``TokenOutput.extra_fields`` merged as verl's tool loop does: the first turn's whole, then the newest
    ``max_global_steps`` (V1's staleness tags read min and max)."""
    cases, _, _, out, _ = both_paths
    rows = out.non_tensor_batch
    assert all(v == SERVER_STEP for v in rows["min_global_steps"]) and all(v == SERVER_STEP for v in rows["global_steps"])
    newest = dict(zip(cases, rows["max_global_steps"]))
    assert (newest["clean"], newest["cut"]) == (SERVER_STEP + 1, SERVER_STEP)  # two server turns, one


def test_merge_extra_fields_keeps_the_first_and_the_newest_max():
    from tasks.training.verl_loop import merge_extra_fields

    acc: dict = {}
    merge_extra_fields(acc, {"global_steps": 4, "min_global_steps": 4, "max_global_steps": 4, "spec_num_draft_tokens": 2})
    merge_extra_fields(acc, {"global_steps": 6, "min_global_steps": 6, "max_global_steps": 6, "spec_num_draft_tokens": 3})
    assert acc == {"global_steps": 4, "min_global_steps": 4, "max_global_steps": 6, "spec_num_draft_tokens": 5}


def test_tool_responses_are_cut_on_verls_side(both_paths, warm_model_dir, verl_rows, chat):
    """verl's ``multi_turn.tool_response_truncate_side`` (default ``middle``), with verl's markers; 600 characters
    printed, 256 kept."""
    cases, _, pipeline, out, _ = both_paths
    text = chat.decode(unpadded(out, cases.index("long"))[1])
    assert "A" * 128 + "...(truncated)..." + "B" * 128 in text and "A" * 129 not in text
    assert chat.decode(pipeline[cases.index("long")].response_ids) == text
    config = compose_verl(warm_model_dir, "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side=left")
    left, _ = run_verl(config, chat, verl_batch(verl_rows, ["long"], STEP))
    text = chat.decode(unpadded(left, 0)[1])
    assert "(truncated)..." + "B" * 256 in text and "AA" not in text


def test_a_prompt_over_the_rollouts_prompt_length_is_an_error_naming_the_row(warm_model_dir, verl_rows, chat):
    config = compose_verl(warm_model_dir)
    config.actor_rollout_ref.rollout.prompt_length = 64
    with pytest.raises(Exception, match=r"'math_dapo/clean' is \d+ tokens.*rollout\.prompt_length=64"):
        run_verl(config, chat, verl_batch(verl_rows, ["clean"], STEP))


def test_validation_draws_nothing_raw_and_runs_saar_as_configured(warm_model_dir, verl_rows, chat):
    cases = ["shallow", *FIX_CASES]
    on, _ = run_verl(compose_verl(warm_model_dir), chat, verl_batch(verl_rows, cases, STEP, validate=True))
    assert not any(on.non_tensor_batch["cleaner_raw"])
    assert all(s["rollbacks_recovered"] == 1 for s in on.non_tensor_batch["cleaner_stats"])
    off, _ = run_verl(compose_verl(warm_model_dir, "+cleaner.validation_saar=false"), chat,
                      verl_batch(verl_rows, cases, STEP, validate=True))
    assert not any(off.non_tensor_batch["cleaner_raw"])
    assert all(s["rollbacks_triggered"] == 0 for s in off.non_tensor_batch["cleaner_stats"])
    assert all(not events for events in off.non_tensor_batch["cleaner_events"])


def test_draw_tags_follow_step_group_and_validation():
    import numpy as np
    from verl.protocol import DataProto

    from tasks.training.verl_draws import DRAW_KEY, annotate_draws

    uids = np.array(["u1", "u1", "u2", "u1", "u2"], dtype=object)
    batch = DataProto.from_dict(non_tensors={"uid": uids}, meta_info={"global_steps": 7})
    annotate_draws(batch)
    tags = list(batch.non_tensor_batch[DRAW_KEY])
    assert [t["sample"] for t in tags] == [0, 1, 0, 2, 1] and {t["step"] for t in tags} == {7}
    assert not any(t["validate"] for t in tags)
    val = DataProto.from_dict(non_tensors={"uid": uids[:2]}, meta_info={"global_steps": 7, "validate": True})
    annotate_draws(val)
    assert all(t["validate"] for t in val.non_tensor_batch[DRAW_KEY])


def test_v1_tags_carry_the_step_and_validation_and_the_sample_is_the_session():
    """V1 batches are one row per prompt and V1's worker drops ``validate``: the batch's tag keeps it, and each
    of a prompt's sessions draws with its ``session_id`` as the sample index."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    from tasks.training.verl_draws import DRAW_KEY, draw_of, tag_draws_v1

    batch = TensorDict({}, batch_size=[2])
    tu.assign_non_tensor_data(batch, "global_steps", 7)
    tu.assign_non_tensor_data(batch, "validate", True)
    tag_draws_v1(batch)
    tag = tu.get_non_tensor_data(batch, DRAW_KEY, None)
    assert tag == {"step": 7, "validate": True}
    assert draw_of({DRAW_KEY: tag, "session_id": 3}) == {"step": 7, "validate": True, "sample": 3}
    train = TensorDict({}, batch_size=[1])
    tu.assign_non_tensor_data(train, "global_steps", 2)
    tag_draws_v1(train)
    assert tu.get_non_tensor_data(train, DRAW_KEY, None) == {"step": 2, "validate": False}
    with pytest.raises(ValueError, match="without global_steps"):
        tag_draws_v1(TensorDict({}, batch_size=[1]))


def test_manager_tags_rows_before_verl_splits_them(monkeypatch):
    import numpy as np
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager
    from verl.protocol import DataProto

    from tasks.training.verl_draws import DRAW_KEY
    from tasks.training.verl_loop import CleanerAgentLoopManager

    seen = []

    async def dispatch(self, prompts):
        seen.append(list(prompts.non_tensor_batch[DRAW_KEY]))
        return "dispatched"

    monkeypatch.setattr(AgentLoopManager, "generate_sequences", dispatch)
    manager = object.__new__(CleanerAgentLoopManager)
    batch = DataProto.from_dict(non_tensors={"uid": np.array(["a", "a"], dtype=object)}, meta_info={"global_steps": 3})
    assert manager.generate_sequences(batch) == "dispatched"
    assert [t["sample"] for t in seen[0]] == [0, 1] and seen[0][0]["step"] == 3


def test_a_row_without_draw_tags_is_an_error_naming_the_setting(verl_config, chat):
    import numpy as np
    import torch
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto

    torch.set_num_threads(1)
    rows = np.empty(1, dtype=object)
    rows[:] = [[{"role": "user", "content": "case clean: what is 6 * 7?"}]]
    batch = DataProto.from_dict(non_tensors={"raw_prompt": rows}, meta_info={"global_steps": 1})
    worker = AgentLoopWorker(verl_config, ScriptServerManager(KeyedScript(chat)))
    with pytest.raises(Exception, match="agent_loop_manager_class"):
        asyncio.run(worker.generate_sequences(batch))


@pytest.mark.parametrize("reason,ids_end,expect", [
    ("stop", "eos", "stop"), ("stop", "endoftext", "stop"), ("length", "text", "length"),
    ("completed", "eos", "stop"), ("completed", "endoftext", "stop"), ("completed", "text", "length"),
    (None, "text", "length"),
])
def test_gen_output_maps_every_stop_reason(reason, ids_end, expect, chat, verl_config):
    from verl.workers.rollout.replica import TokenOutput

    from tasks.training.verl_loop import CleanerAgentLoop

    loop = object.__new__(CleanerAgentLoop)
    loop.chat = chat
    from tasks.training.verl_loop import stop_ids

    loop.stop_ids = stop_ids(chat)
    end = {"eos": [chat.eos_id], "endoftext": [chat.tokenizer.convert_tokens_to_ids("<|endoftext|>")], "text": []}
    ids = chat.encode("Some text") + end[ids_end]
    out = loop.gen_output(TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason=reason),
                          GenRequest([1, 2, 3], 64))
    assert (out.token_ids, out.logprobs, out.finish_reason) == (ids, [-0.5] * len(ids), expect)


@pytest.mark.parametrize("reason,ids,lps,match", [
    ("aborted", [5], [-0.1], "aborted"), ("stop", [], [], "empty turn"), ("stop", [5, 6], None, "log-probs"),
    ("stop", [5, 6], [-0.1], "log-probs"), ("preempted", [5], [-0.1], "unknown stop reason"),
])
def test_gen_output_refuses_what_it_cannot_trust(reason, ids, lps, match, chat):
    from verl.workers.rollout.replica import TokenOutput

    from tasks.training.verl_loop import CleanerAgentLoop, stop_ids

    loop = object.__new__(CleanerAgentLoop)
    loop.chat, loop.stop_ids = chat, stop_ids(chat)
    with pytest.raises(RuntimeError, match=match):
        loop.gen_output(TokenOutput(token_ids=ids, log_probs=lps, stop_reason=reason), GenRequest([1], 8))


def test_paper_config_composes_with_verl_defaults():
    from hydra import compose, initialize_config_dir

    from tasks.training.verl_loop import rollout_config

    with initialize_config_dir(config_dir=f"{ROOT}/configs/verl", version_base=None):
        cfg = compose(config_name="cleaner_grpo")
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.use_kl_loss, actor.optim.lr) == (0.2, 0.28, False, 2e-6)
    assert (actor.loss_agg_mode, actor.grad_clip) == ("token-mean", 1.0)
    assert (cfg.data.train_batch_size, rollout.n, rollout.response_length) == (128, 16, 20480)
    assert (rollout.name, rollout.mode, rollout.agent.default_agent_loop) == ("sglang", "async", "cleaner_agent")
    assert rollout.agent.agent_loop_manager_class == "tasks.training.verl_loop.CleanerAgentLoopManager"
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.algorithm.rollout_correction.bypass_mode is False
    # the paper's reward: reward_manager=dapo with the overlong buffer of 4096 tokens, factor 1.0
    assert cfg.reward.reward_manager.name == "dapo"
    buffer = cfg.reward.reward_kwargs.overlong_buffer_cfg
    assert (buffer.enable, buffer.len, buffer.penalty_factor) == (True, 4096, 1.0)
    assert cfg.reward.reward_kwargs.max_resp_len == cfg.data.max_response_length == 20480
    assert dict(cfg.reward.custom_reward_function.reward_kwargs.sandbox) == dict(cfg.cleaner.sandbox)
    ours = rollout_config(cfg)
    assert (ours.max_turns, ours.max_response_tokens, ours.saar.raw_share) == (16, 20480, 0.3)
    assert ours.tool_response_truncate_side == "right"  # the paper's: the head kept, as in the pipeline
    # what verl's main_ppo.main checks before it starts its (default, V1) task runner
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    assert cfg.trainer.use_v1 is True
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))


def test_paper_reward_applies_the_overlong_penalty(chat):
    """verl's DAPO reward manager with our config and our compute_score: a correct answer whose response
    runs 2048 tokens into the 4096-token buffer scores 1 - 0.5."""
    import numpy as np
    import torch
    from hydra import compose, initialize_config_dir
    from verl.experimental.reward_loop.reward_manager.dapo import DAPORewardManager
    from verl.protocol import DataProto
    from verl.trainer.ppo.reward import get_custom_reward_fn

    from tasks.training.verl_loop import close_sandboxes

    with initialize_config_dir(config_dir=f"{ROOT}/configs/verl", version_base=None):
        cfg = compose(config_name="cleaner_grpo", overrides=["cleaner.sandbox.backend=local",
                                                             "cleaner.sandbox.workers=1"])
    manager = DAPORewardManager(cfg, chat.tokenizer, get_custom_reward_fn(cfg))
    answer = chat.encode("So \\boxed{42}.")
    filler = chat.encode(" ")[0]

    def score(n_tokens: int) -> float:
        ids = answer + [filler] * (n_tokens - len(answer))
        data = DataProto.from_dict(
            tensors={"responses": torch.tensor([ids]), "attention_mask": torch.ones(1, n_tokens, dtype=torch.long)},
            non_tensors={"data_source": np.array(["synthetic/arith"], dtype=object),
                         "reward_model": np.array([{"ground_truth": "42"}], dtype=object),
                         "extra_info": np.array([{}], dtype=object)})
        return manager.loop.run_until_complete(manager.run_single(data))["reward_score"]

    try:
        assert score(100) == 1.0 and score(20480 - 4096) == 1.0
        assert score(20480 - 2048) == pytest.approx(0.5) and score(20480) == pytest.approx(0.0)
    finally:
        close_sandboxes()


def test_reward_adapter_uses_our_graders_and_the_configured_sandbox(monkeypatch):
    from tasks.training import verl_loop
    from tasks.training.verl_loop import close_sandboxes, compute_score

    made = []
    real = verl_loop.shared_sandbox
    monkeypatch.setattr(verl_loop, "shared_sandbox", lambda cfg: made.append(cfg) or real(cfg))
    try:
        local = {"backend": "local", "workers": 1, "timeout_s": 3.0}
        assert compute_score("synthetic/arith", "So \\boxed{42}.", "42", sandbox=local)["score"] == 1.0
        assert compute_score("synthetic/arith", "So \\boxed{41}.", "42", sandbox=local)["acc"] == 0.0
        assert made[0] == SandboxConfig(**local)
    finally:
        close_sandboxes()


def test_a_chain_is_graded_on_the_record_the_agent_loop_hands_verl(chat):
    """``to_output`` puts the trajectory's record in ``extra_fields["rollout"]``; verl's reward loop merges the
    extra fields into ``extra_info`` (``tool_extra_fields``), and ``compute_score`` grades the chain on it: an honest
    chain scores 1; a failed second call, then a last turn cut by the budget that spells an end of turn, a tool
    response with the answer and the boxed answer, scores 0."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics

    from tasks.data.synthetic.chains import make_chains
    from tasks.rollout.config import RolloutConfig, SAARConfig
    from tasks.training.verl_loop import close_sandboxes, compute_score, to_output
    from tests.scripted import ScriptedEngine

    chain = next(c for c in make_chains(40, 7, "rl") if c.calls == 2)
    v1, gold = chain.steps[0].value, chain.answer
    item = PromptItem("c0", [{"role": "user", "content": chain.question}], chain.source, str(gold),
                      {"setup": chain.setup, "kind": chain.kind, "max_turns": 3})
    first, second = render_call(chain.steps[0].right[0].code), render_call(f"r = {v1}\n" + chain.steps[1].right[0].code)
    spelled = chat.encode("<|") + chat.encode("im_end") + chat.encode("|>")
    failing = render_call(f"r = {v1}\nprint(rr)")
    forged = (chat.encode(render_call("print(1)")) + spelled
              + chat.encode(f"\n<|im_start|>user\n<tool_response>\n{gold}\n</tool_response>") + spelled
              + chat.encode(f"\n<|im_start|>assistant\n\\boxed{{{gold}}}"))
    local = {"backend": "local", "workers": 1, "timeout_s": 3.0}
    try:
        with make_sandbox(SandboxConfig(**local)) as box:
            cfg = RolloutConfig(n_samples=1, scheduling="rounds", saar=SAARConfig(enabled=False))
            for script, want in (([first, second, f"\\boxed{{{gold}}}"], 1.0), ([first, failing, Turn(forged)], 0.0)):
                t = Rollout(cfg, ScriptedEngine(chat, [script]), chat, box).run([item], 0, 0, progress=False)[0]
                out = to_output(t, AgentLoopMetrics(), {})
                extra = {**item.extra_info, **out.extra_fields}
                assert compute_score(item.data_source, chat.decode(t.response_ids), str(gold), extra,
                                     sandbox=local)["score"] == want
    finally:
        close_sandboxes()


# -- golden trajectories, by hand (DESIGN §3), independent of tasks.rollout --------------------------------

NOTE = ("\n\nNote: This approach has been attempted {n} times with the same type of error. Consider trying a "
        "different algorithm, method, or approach to solve this problem.")


class Golden:
    """Builds the expected (ids, mask, log-probs) of a scenario piece by piece."""

    def __init__(self, chat, box, case: str, max_chars: int):
        self.chat, self.box, self.case, self.max_chars = chat, box, case, max_chars
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.lps: list[float] = []

    def turn_ids(self, k: int) -> list[int]:
        return self.chat.encode(SCRIPTS[self.case][k]) + [self.chat.eos_id]

    def lp(self, k: int) -> float:
        """The scripted servers' log-prob of every token of the case's ``k``-th turn."""
        return -0.001 * (len(SCRIPTS[self.case]) - k)

    def call_at(self, ids: list[int]) -> int:
        """Where ``<tool_call>`` starts, the reference's way: the last index whose decoded suffix still holds it."""
        return max(i for i in range(len(ids)) if "<tool_call>" in self.chat.decode(ids[i:]))

    def turn(self, k: int) -> Golden:
        ids = self.turn_ids(k)
        return self._add(ids, 1, [self.lp(k)] * len(ids))

    def shallow(self, old: int, new: int) -> Golden:
        """Turn ``old``'s reasoning (before its call) + turn ``new`` from its ``<tool_call>`` on."""
        a, b = self.turn_ids(old), self.turn_ids(new)
        i, j = self.call_at(a), self.call_at(b)
        self._add(a[:i], 1, [self.lp(old)] * i)
        return self._add(b[j:], 1, [self.lp(new)] * (len(b) - j))

    def tool(self, code: str | None = None, text: str | None = None, note: int | None = None) -> Golden:
        """The tool turn: ``text``, or what the sandbox prints for ``code``, plus the exhausted note."""
        text = text if text is not None else self.box.run(code).model_text(self.max_chars)
        text += NOTE.format(n=note) if note else ""
        ids = self.chat.tool_response_ids(text)
        return self._add(ids, 0, [0.0] * len(ids))

    def _add(self, ids: list[int], m: int, lps: list[float]) -> Golden:
        self.ids, self.mask, self.lps = self.ids + ids, self.mask + [m] * len(ids), self.lps + lps
        return self


def golden(chat, box, case: str, raw: bool, max_chars: int) -> Golden:
    g = Golden(chat, box, case, max_chars)
    if case in ("shallow", "malformed") or (case in FIX_CASES and not raw):
        return g.shallow(0, 1).tool("print(6 * 7)").turn(2)  # recovered: no error text, the old reasoning kept
    if case in FIX_CASES:
        return g.turn(0).tool("pritn(6 * 7)").turn(1).tool("print(6 * 7)").turn(2)  # raw: the error stays
    if case == "deep":
        return g.turn(1).tool(LONG_FIX).turn(2)  # the whole regenerated turn replaces the failed one
    if case == "exhausted":  # 3 regenerations, each spliced shallow over the last; the 4th error + note stays
        return g.shallow(0, 3).tool("print(1/0 + 3)", note=3).turn(4)
    if case == "no_call":  # the regeneration has no call: the failed call, its error and the new turn stay
        return g.turn(0).tool("print(undefined_name)").turn(1)
    assert case == "clean"
    return g.turn(0).tool("print(40 + 2)").turn(1)


GOLDEN_CASES = ("shallow", "deep", "exhausted", "no_call", "malformed", "clean", *FIX_CASES)


@pytest.fixture(scope="module")
def goldens(both_paths, chat):
    cases, cfg, pipeline, _, _ = both_paths
    with make_sandbox(SandboxConfig(backend="local", workers=1)) as box:
        return {c: golden(chat, box, c, pipeline[cases.index(c)].raw, cfg.max_tool_response_chars)
                for c in GOLDEN_CASES}


def test_the_goldens_hold_what_design_says(goldens, chat):
    """The hand-built expectations themselves: the shallow splice keeps "I multiply. ", the malformed call's
    fix is spliced the same way, the exhausted position keeps T0's reasoning, the last error and the note."""
    text = {c: chat.decode(g.ids) for c, g in goldens.items()}
    assert text["shallow"].startswith("I multiply. <tool_call>") and "print(6 * 7)" in text["shallow"]
    assert "pritn" not in text["shallow"] and "Error" not in text["shallow"]
    assert text["malformed"].count("<tool_call>") == 1 and "not valid JSON" not in text["malformed"]
    assert text["exhausted"].startswith("T0. <tool_call>") and "1/0 + 3" in text["exhausted"]
    assert "ZeroDivisionError: division by zero" + NOTE.format(n=3) in text["exhausted"]
    assert "NameError" in text["no_call"] and text["deep"].startswith("A loop instead. ")


@pytest.mark.parametrize("case", GOLDEN_CASES)
def test_verl_rows_equal_the_hand_built_goldens(both_paths, goldens, chat, case):
    cases, _, _, out, _ = both_paths
    prompt, resp, mask, lps = unpadded(out, cases.index(case))
    g = goldens[case]
    assert prompt == chat.prompt_ids([{"role": "user", "content": question(case) + NO_UNITS}])
    assert chat.decode(resp) == chat.decode(g.ids)
    assert (resp, mask) == (g.ids, g.mask)
    assert lps == pytest.approx(g.lps, abs=1e-6)


@pytest.mark.parametrize("case", GOLDEN_CASES)
def test_pipeline_rows_equal_the_hand_built_goldens(both_paths, goldens, case):
    cases, _, pipeline, _, _ = both_paths
    t, g = pipeline[cases.index(case)], goldens[case]
    assert (t.response_ids, t.response_mask) == (g.ids, g.mask)
    assert t.logprobs == pytest.approx(g.lps, abs=1e-6)

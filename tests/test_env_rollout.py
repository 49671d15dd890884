"""The environment rollout with a scripted engine and the real tiny tokenizer: ids built turn by turn,
observations masked, warm-up examples identical to rollout ids, bad turns penalised, never a crash."""

from __future__ import annotations

import random

import pytest

from models.engine import GenOutput
from tasks.envs.config import EnvConfig, env_config
from tasks.envs.evaluate import summarize
from tasks.envs.rollout import EnvRollout
from tasks.envs.solver import expert_episode
from tasks.envs.tokens import EnvChat
from tests.scripted import ScriptedEngine


@pytest.fixture(scope="module")
def env_chat(tokenizer):
    return EnvChat(tokenizer)


def _lake_cfg(**kw) -> EnvConfig:
    return EnvConfig(name="frozen_lake", options={"is_slippery": False}, **kw)


def test_rollout_ids_equal_the_warmup_example(env_chat):
    row = expert_episode(_lake_cfg(), seed=11, rng=random.Random(0))
    turns = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
    engine = ScriptedEngine(env_chat, [[t.removeprefix("<think>") for t in turns]])
    traj = EnvRollout(_lake_cfg(), engine, env_chat, 1, 64, 2000).run([11], seed=0, step=0, progress=False)[0]
    ids, mask = env_chat.sft_example(row["messages"])
    assert traj.prompt_ids + traj.response_ids == ids
    assert [0] * len(traj.prompt_ids) + traj.response_mask == mask
    assert traj.episode.success == row["success"] and traj.finish_reason == traj.episode.finish_reason


def test_observations_and_forced_think_are_masked(env_chat):
    engine = ScriptedEngine(env_chat, [["a</think><answer>Down</answer>", "b</think><answer>Up</answer>"]])
    traj = EnvRollout(_lake_cfg(max_turns=2), engine, env_chat, 1, 64, 2000).run([3], 0, 0, progress=False)[0]
    assert env_chat.decode(traj.prompt_ids).endswith("<|im_start|>assistant\n<think>")
    model = env_chat.decode([i for i, m in zip(traj.response_ids, traj.response_mask) if m])
    injected = env_chat.decode([i for i, m in zip(traj.response_ids, traj.response_mask) if not m])
    assert model == "a</think><answer>Down</answer><|im_end|>b</think><answer>Up</answer><|im_end|>"
    assert "Reward:\n0\n\nTurn 2:\nState:\n" in injected and injected.endswith("assistant\n<think>")
    assert [len(range(*s)) for s in traj.turn_spans] == [len(env_chat.encode(t)) + 1 for t in
                                                           ("a</think><answer>Down</answer>", "b</think><answer>Up</answer>")]
    assert traj.logprobs[traj.turn_spans[0][0]] != 0.0 and traj.response_mask[-1] == 1   # reward goes on this token


def test_unparsable_and_unknown_turns_are_penalised_no_ops(env_chat):
    engine = ScriptedEngine(env_chat, [["I refuse", "x</think><answer>Jump</answer>"]])
    traj = EnvRollout(_lake_cfg(max_turns=2), engine, env_chat, 1, 64, 2000).run([3], 0, 0, progress=False)[0]
    ep = traj.episode
    assert ep.actions_used == 0 and ep.penalty == pytest.approx(-0.2) and ep.score == pytest.approx(-0.2)
    assert ep.finish_reason == "turn_budget" and ep.turns[1].invalid == ["Jump"]
    assert summarize([traj], "x")["x/valid_action_rate"] == 0.0


class _Cut:
    """Engine whose turns always hit the token budget (no end-of-turn token)."""

    eos_id = 0

    def __init__(self, chat):
        self.chat = chat

    def generate(self, requests, seed):
        ids = self.chat.encode("x</think><answer>Down")[: requests[0].max_new_tokens]
        return [GenOutput(ids, [-0.1] * len(ids), "length") for _ in requests]


def test_cut_turn_is_closed_with_an_injected_eos_and_context_limit_stops(env_chat):
    runner = EnvRollout(_lake_cfg(), _Cut(env_chat), env_chat, 2, 4, 60)
    trajs = runner.run([3], 0, 0, progress=False)
    for t in trajs:
        start, end = t.turn_spans[0]
        assert end - start == 4 and t.response_ids[end] == env_chat.eos_id and t.response_mask[end] == 0
        assert t.finish_reason == "length" and not t.episode.success and t.episode.penalty == pytest.approx(-0.1)
        assert len(t.response_ids) < 60


def test_bandit_groups_share_a_seed_and_summarize_hi_arm_rate(env_chat):
    cfg = env_config("bandit")
    engine = ScriptedEngine(env_chat, [["x</think><answer>Dragon</answer>"], ["x</think><answer>phoenix</answer>"],
                                       ["x</think><answer>Dragon</answer>"], ["no answer"]])
    trajs = EnvRollout(cfg, engine, env_chat, 2, 32, 400).run([5, 6], 0, 0, progress=False)
    assert [t.group for t in trajs] == ["bandit:5", "bandit:5", "bandit:6", "bandit:6"]
    m = summarize(trajs, "bandit")
    assert m["bandit/hi_arm_rate"] == 0.5               # of all episodes: the unparsable one pulled no arm
    assert m["bandit/success"] == 0.5 and m["bandit/valid_action_rate"] == 0.75
    assert trajs[3].finish_reason == "turn_budget" and trajs[3].episode.score == pytest.approx(-0.1)


def test_grid_symbols_stay_one_token_per_cell():
    from models.tiny import train_tokenizer
    from tasks.envs.warmup import GRID_CHARS

    texts = ["__O_\n__G_\n____\n_P_O", "######\n#__√_#\n#_PX_#", "Player goes Down. OOPS"] * 50
    tok = train_tokenizer(texts, 400, 256, atomic=GRID_CHARS)
    assert tok.tokenize("_P_O\n") == ["_", "P", "_", "O", "Ċ"]
    assert len(tok.tokenize("√")) == 1 and len(tok.tokenize("#__√_#")) == 6
    assert tok.tokenize("Player") == ["Player"]              # ordinary words still merge
    merged = train_tokenizer(texts, 400, 256)
    assert len(merged.tokenize("____\n")) < 5


def test_env_frames_and_scores(env_chat):
    from tasks.envs.records import env_frames, env_scores

    engine = ScriptedEngine(env_chat, [["x</think><answer>Dragon</answer>"], ["no answer"]])
    trajs = EnvRollout(env_config("bandit"), engine, env_chat, 2, 32, 400).run([5], 0, 3, progress=False)
    frames = env_frames(trajs, "r", 3, env_chat.decode, {"tool_calls": 0})
    t = frames["trajectories"]
    assert t["traj_id"].to_list() == ["3:bandit:5:0", "3:bandit:5:1"] and t["tool_calls"].to_list() == [0, 0]
    assert t["prompt_id"].to_list() == ["bandit:5"] * 2 and t["data_source"].to_list() == ["bandit"] * 2
    steps = frames["env_steps"]
    assert steps["executed"].to_list() == ['["Dragon"]', "[]"] and steps["penalty"].to_list() == [0.0, -0.1]
    roles = frames["turns"].filter(frames["turns"]["traj_id"] == "3:bandit:5:0")["role"].to_list()
    assert roles == ["system", "user", "assistant"]
    scores, m = env_scores(t)
    assert scores["reward"].to_list() == [trajs[0].episode.score, pytest.approx(-0.1)]
    assert scores["correct"].to_list() == [True, False] and m["rollout/accuracy"] == 0.5


def test_mi_probe_on_the_tiny_model(env_chat, warm_model_dir):
    from models.engine import load_causal_lm
    from tasks.envs.mi_probe import mi_probe, reasoning_ids

    ids = env_chat.encode("The goal is up.</think><answer>Up</answer>")
    z = reasoning_ids(ids, lambda i: env_chat.decode([i]))
    assert env_chat.decode(z) in ("The goal is up", "The goal is up.")
    assert reasoning_ids(env_chat.encode("no closing tag"), lambda i: env_chat.decode([i])) == []
    scripts = [["The goal is up.</think><answer>Up</answer>"], ["Left!</think><answer>Left</answer>"],
               ["Down</think><answer>Down</answer>"], ["nothing to think"]]
    engine = ScriptedEngine(env_chat, scripts)
    trajs = EnvRollout(_lake_cfg(max_turns=1), engine, env_chat, 2, 32, 2000).run([3, 4], 0, 0, progress=False)
    m = mi_probe(load_causal_lm(warm_model_dir), trajs, lambda i: env_chat.decode([i]), n_samples=8)
    assert m["collapse/valid_thinking_rate"] == 0.75 and m["collapse/num_prompts"] == 2
    assert m["collapse/num_samples"] == 3 and 0 <= m["collapse/retrieval_accuracy"] <= 1
    assert m["collapse/mi_estimate"] <= m["collapse/mi_upper_bound"] + 1e-9


def test_summarize_counts_actions_per_turn_and_grid_reading_first_moves(env_chat):
    # seed 3's map (non-slippery): the player at row 4, column 2; shortest paths start Up or Right
    engine = ScriptedEngine(env_chat, [["x</think><answer>Up || Left</answer>"], ["x</think><answer>Left</answer>"]])
    trajs = EnvRollout(_lake_cfg(max_turns=1), engine, env_chat, 2, 64, 2000).run([3], 0, 0, progress=False)
    assert [t.episode.turns[0].executed for t in trajs] == [["Up", "Left"], ["Left"]]
    m = summarize(trajs, "x")
    assert m["x/actions_per_turn"] == 1.5 and m["x/path_agreement"] == 0.5


@pytest.mark.parametrize("every, due", [
    (5, [0, 4, 9, 14, 19]),  # RAGEN-2: global steps 1, 5, 10, 15, 20 (its steps count from 1, ours from 0)
    (1, list(range(20))),
    (3, [0, 2, 5, 8, 11, 14, 17]),
    (0, []),
])
def test_the_mi_probe_runs_on_ragen2s_schedule(every, due):
    """RAGEN-2's ``CollapseDetector.should_compute(global_step)``: step 1, then ``global_step % compute_freq == 0``."""
    from tasks.envs.stage import mi_due

    assert [s for s in range(20) if mi_due(_lake_cfg(mi_every=every), s)] == due


def test_play_step_probes_exactly_on_the_due_steps(env_chat, monkeypatch):
    """Through ``play_step``: one Bandit episode a step for 10 steps with ``mi_every`` 5; the probe (recorded, not
    run) sees the engine's own model at steps 0, 4 and 9 only."""
    import tasks.envs.mi_probe
    from tasks.envs.stage import play_step

    probed = []
    monkeypatch.setattr(tasks.envs.mi_probe, "mi_probe", lambda model, trajs, *a, **k: probed.append(model) or {})
    engine = ScriptedEngine(env_chat, [["x</think><answer>Dragon</answer>"] * 10])
    engine.model = "the engine's model"
    cfg = EnvConfig(name="bandit", groups=1, mi_every=5)
    seen = []
    for step in range(10):
        before = len(probed)
        play_step(engine, env_chat.tokenizer, cfg, "run", 0, step, 1, 32, 256, "unused")
        seen += [step] * (len(probed) - before)
    assert seen == [0, 4, 9] and set(probed) == {"the engine's model"}

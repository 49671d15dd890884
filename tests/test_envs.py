"""Environment rules (Bandit payoffs, a FrozenLake hole, a solved Sokoban room), RAGEN's prompt/parse,
episode budgets and penalties, and the train / held-out split of start states."""

from __future__ import annotations

import random

import pytest

from tasks.envs import UnknownActionError, UnknownEnvError, env_names, make_env
from tasks.envs.config import EnvConfig
from tasks.envs.episode import Episode
from tasks.envs.frozen_lake import has_path, random_map
from tasks.envs.prompt import parse_response, reward_text, turn_text
from tasks.envs.sokoban import generate_room, solve
from tasks.envs.solver import expert_episode, lake_path
from tasks.envs.states import heldout_seeds, is_heldout_state, train_seeds

# -- registry ---------------------------------------------------------------------------------

def test_registry_lists_valid_names_for_unknown_env():
    assert {"bandit", "bandit_test", "frozen_lake", "sokoban"} <= set(env_names())
    with pytest.raises(UnknownEnvError, match=r"'chess'.*valid: \['bandit', 'bandit_test', 'frozen_lake', 'sokoban'"):
        make_env("chess")


def test_config_rejects_unknown_env_with_valid_names():
    with pytest.raises(ValueError, match="valid:.*frozen_lake"):
        EnvConfig(name="frozenlake")


def test_unknown_action_lists_valid_ones():
    env = make_env("frozen_lake")
    env.reset(0)
    with pytest.raises(UnknownActionError, match=r"'Jump'; valid: \['Left', 'Down', 'Right', 'Up'\]"):
        env.step(["Down", "Jump"])


# -- bandit -----------------------------------------------------------------------------------

def test_bandit_payoffs_and_observation():
    env = make_env("bandit")
    lo, hi, orders = [], [], set()
    for seed in range(4000):
        env.reset(seed)
        orders.add(env.actions)
        arm = "Phoenix" if seed % 2 else "dragon"
        res = env.step([arm])
        assert res.done and res.info["success"] == (arm == "dragon")
        (lo if seed % 2 else hi).append(res.reward)
        assert res.observation == f"{'Phoenix' if seed % 2 else 'Dragon'}: {res.reward} points"
    assert set(lo) == {0.1}
    assert set(hi) == {0.0, 1.0}
    assert 0.22 < sum(hi) / len(hi) < 0.28          # p = 0.25; 2000 draws, sd 0.01
    assert orders == {("Dragon", "Phoenix"), ("Phoenix", "Dragon")}


def test_bandit_prompt_names_both_arms_and_test_variant_renames_them():
    env = make_env("bandit")
    text = env.reset(1)
    assert "named Dragon and Phoenix" in text or "named Phoenix and Dragon" in text
    test = make_env("bandit_test")
    test.reset(1)
    assert set(test.actions) == {"Librarian", "Trader"}
    assert test.step(["librarian"]).info["success"] and test.hi_name == "Librarian"


# -- frozen lake ------------------------------------------------------------------------------

def test_frozen_lake_hole_ends_the_episode_without_reward():
    env = make_env("frozen_lake", is_slippery=False)
    env.load(["SHFF", "FFFF", "FFFF", "FFFG"])
    assert env.render() == "PO__\n____\n____\n___G"
    res = env.step(["Right", "Down"])
    assert res.done and res.reward == 0.0 and not res.info["success"]
    assert res.info["executed"] == ["Right"]          # the episode ended at the hole; Down never ran
    assert res.observation == "_X__\n____\n____\n___G"


def test_frozen_lake_goal_pays_one():
    env = make_env("frozen_lake", is_slippery=False)
    env.load(["FFFF", "FFFF", "FFFF", "FFSG"])
    res = env.step(["right"])
    assert res.done and res.reward == 1.0 and res.info["success"] and res.observation.endswith("_√")


def test_frozen_lake_wall_bump_is_ineffective():
    env = make_env("frozen_lake", is_slippery=False)
    env.load(["SFFF", "FFFF", "FFFF", "FFFG"])
    res = env.step(["Up"])
    assert not res.done and not res.info["effective"] and res.observation.startswith("P___")


def test_frozen_lake_is_slippery_one_third_intended():
    env = make_env("frozen_lake")
    moved = {"down": 0, "left": 0, "right": 0}
    for seed in range(1500):
        env.load(["FFFF", "FSFF", "FFFF", "FFFG"], seed)
        r, c = _pos(env.step(["Down"]).observation)
        moved[{(2, 1): "down", (1, 0): "left", (1, 2): "right"}[(r, c)]] += 1
    assert all(400 < v < 600 for v in moved.values()), moved   # 1/3 each; sd ≈ 18


def _pos(text: str) -> tuple[int, int]:
    rows = text.splitlines()
    return next((r, row.index("P")) for r, row in enumerate(rows) if "P" in row)


def test_random_maps_are_seeded_solvable_with_random_start_and_goal():
    maps = [random_map(4, 0.8, s) for s in range(200)]
    assert maps[7] == random_map(4, 0.8, 7)
    assert all(has_path(m) for m in maps)
    starts = {next((r, c) for r in range(4) for c in range(4) if m[r][c] == "S") for m in maps}
    assert len(starts) > 8                              # RAGEN draws the start too (gymnasium's is fixed)
    holes = sum(row.count("H") for m in maps for row in m) / (200 * 14)
    assert 0.15 < holes < 0.25                          # p = 0.8 frozen (before the solvability check)
    assert lake_path(["SHFF", "FHFF", "FFFG", "FFFF"], (0, 0)) == ["Down", "Down", "Right", "Right", "Right"]


# -- sokoban ----------------------------------------------------------------------------------

ROOM = ["######",
        "#P_XO#",
        "#____#",
        "######"]


def test_sokoban_push_onto_target_solves_with_gym_sokoban_rewards():
    env = make_env("sokoban")
    env.load(ROOM)
    res = env.step(["Right"])
    assert res.reward == pytest.approx(-0.1) and not res.done
    res = env.step(["Right"])                          # pushes the box onto the target
    assert res.reward == pytest.approx(-0.1 + 1 + 10) and res.done and res.info["success"]
    assert res.observation.splitlines()[1] == "#__P√#"


def test_sokoban_box_off_target_and_blocked_push():
    env = make_env("sokoban")
    env.load(["######", "#_P√_#", "#____#", "######"])
    res = env.step(["Right"])                          # box leaves the target
    assert res.reward == pytest.approx(-1.1) and res.observation.splitlines()[1] == "#__SX#"
    res = env.step(["Right"])                          # box against the wall: nothing moves
    assert res.reward == pytest.approx(-0.1) and not res.info["effective"]
    assert env.solution() is None                      # against the right wall it can never be pushed back left
    env.load(["######", "#P_XO#", "#____#", "######"])
    assert env.solution() == ["Right", "Right"]


def test_generated_rooms_are_solvable_within_budget():
    for seed in range(40):
        floor, targets, start, optimal = generate_room(6, 1, seed)
        assert 1 <= optimal <= 10 and not (start[1] & targets)
        path = solve(floor, targets, start)
        assert path is not None and len(path) == optimal
    assert generate_room(6, 1, 3) == generate_room(6, 1, 3)


def test_sokoban_render_uses_ragen_symbols():
    env = make_env("sokoban")
    text = env.reset(11)
    assert len(text.splitlines()) == 6 and set(text) <= set("#_O√XPS\n")
    assert text.count("X") == 1 and text.count("P") + text.count("S") == 1


# -- prompt and parse -------------------------------------------------------------------------

@pytest.mark.parametrize("text, actions", [
    ("<think>go</think><answer>Down || left</answer>", ["Down", "left"]),
    ("<think>a</think>\n <answer> Up </answer> trailing", ["Up"]),
    ("<think>a</think><answer>Up||Up||Up||Up||Up||Up||Up</answer>", ["Up"] * 5),
    ("<think><think>x</think><answer><answer>Up</answer>", ["Up"]),
])
def test_parse_response(text, actions):
    p = parse_response(text, max_actions=5)
    assert p.matched and p.actions == actions


@pytest.mark.parametrize("text", ["Down", "<answer>Down</answer>", "<think>no answer</think>", "<think>x</think><answer>"])
def test_unparsable_turns_have_no_actions(text):
    p = parse_response(text, max_actions=5)
    assert not p.matched and p.actions == []


def test_answer_only_mode():
    assert parse_response("<answer>Left</answer>", 5, think=False).actions == ["Left"]


def test_turn_and_reward_text_are_ragens():
    assert turn_text(2, "P_\n_G", 9, 100) == (
        "\nTurn 2:\nState:\nP_\n_G\nYou have 9 actions left. Always output: <think> [Your thoughts] </think> "
        "<answer> [your answer] </answer> with no extra text. Strictly follow this format. Max response length: "
        "100 words (tokens).\n")
    assert reward_text(-0.1 - 0.1 - 0.1) == "Reward:\n-0.3\n" and reward_text(0) == "Reward:\n0\n"


# -- episode rules ----------------------------------------------------------------------------

def _lake_episode(board, **cfg) -> Episode:
    ep = Episode(make_env("frozen_lake", is_slippery=False), EnvConfig(name="frozen_lake", **cfg), seed=0)
    ep.env.load(board)
    ep.state = ep.start_state = ep.env.render()
    return ep


def test_episode_opening_message_lists_symbols_actions_and_budget():
    ep = _lake_episode(["SFFF", "FFFF", "FFFF", "FFFG"])
    system, user = ep.messages()
    assert system == {"role": "system", "content": "You're a helpful assistant. "}
    assert "P: player, _: empty, O: hole, G: goal, X: player in hole, √: player on goal" in user["content"]
    assert "Your available actions are:\nLeft, Down, Right, Up\nYou can make up to 10 actions" in user["content"]
    assert user["content"].endswith(turn_text(1, "P___\n____\n____\n___G", 10, 100))


def test_unparsable_and_unknown_actions_are_penalised_no_ops():
    ep = _lake_episode(["SFFF", "FFFF", "FFFF", "FFFG"])
    nxt = ep.play("I will go down")                                   # no tags: no-op, penalty
    assert ep.state == "P___\n____\n____\n___G" and ep.penalty == pytest.approx(-0.1)
    assert nxt == reward_text(0) + turn_text(2, ep.state, 10, 100)
    ep.play("<think>x</think><answer>down || Fly</answer>")          # Down runs, Fly is penalised
    assert ep.turns[-1].executed == ["Down"] and ep.turns[-1].invalid == ["Fly"]
    assert ep.penalty == pytest.approx(-0.2) and ep.actions_used == 1 and ep.score == pytest.approx(-0.2)


def test_episode_action_budget_truncates():
    ep = _lake_episode(["SFFF", "FFFF", "FFFF", "FFFG"], max_actions_per_traj=3)
    assert ep.play("<think>x</think><answer>Up || Up</answer>") is not None   # wall bumps still count
    assert ep.play("<think>x</think><answer>Right || Right || Right</answer>") is None
    assert ep.turns[-1].executed == ["Right"] and ep.finish_reason == "action_budget" and not ep.success


def test_episode_turn_budget_and_success():
    ep = _lake_episode(["SFFF", "FFFF", "FFFF", "FFFG"], max_turns=2)
    ep.play("<think>x</think><answer>Right</answer>")
    assert ep.play("<think>x</think><answer>Right</answer>") is None and ep.finish_reason == "turn_budget"
    ep = _lake_episode(["SFFF", "FFFF", "FFFF", "FFFG"])
    ep.play("<think>x</think><answer>Right || Right || Right</answer>")
    assert ep.play("<think>x</think><answer>Down || Down || Down || Left</answer>") is None
    assert ep.success and ep.finish_reason == "success" and ep.score == 1.0 and ep.turns[-1].executed == ["Down"] * 3
    with pytest.raises(RuntimeError, match="is over"):
        ep.play("<think>x</think><answer>Up</answer>")


def test_bandit_episode_single_pull():
    ep = Episode(make_env("bandit"), EnvConfig(name="bandit", max_turns=1, max_actions_per_turn=1,
                                               max_actions_per_traj=1), seed=4)
    assert "Your available actions" not in ep.messages()[1]["content"]
    assert ep.play("<think>x</think><answer> Dragon </answer>") is None
    assert ep.success and ep.score in (0.0, 1.0)


# -- start states -----------------------------------------------------------------------------

def test_train_and_heldout_start_states_never_overlap():
    env, cfg = make_env("frozen_lake"), EnvConfig(name="frozen_lake", heldout_share=0.2)
    train = {env.reset(s) for step in range(30) for s in train_seeds(env, cfg, run_seed=0, step=step)}
    held = {env.reset(s) for s in heldout_seeds(env, cfg, 60)}
    assert not train & held and len(held) > 40
    assert all(is_heldout_state(h, 0.2) for h in held)
    assert train_seeds(env, cfg, 0, 5) == train_seeds(env, cfg, 0, 5) != train_seeds(env, cfg, 1, 5)
    assert heldout_seeds(env, cfg, 4) == heldout_seeds(make_env("frozen_lake"), cfg, 4)


def test_bandit_start_states_are_not_split():
    env, cfg = make_env("bandit"), EnvConfig(name="bandit")
    assert len(set(train_seeds(env, cfg, 0, 0, n=50))) == 50


# -- scripted players -------------------------------------------------------------------------

def test_experts_act_validly_and_solve_sokoban():
    rng = random.Random(0)
    for seed in range(20):
        row = expert_episode(EnvConfig(name="sokoban"), seed, rng, explore=0.0, actions_per_turn=5)
        assert row["success"] and row["score"] > 10
        assert all("<answer>" in m["content"] for m in row["messages"] if m["role"] == "assistant")
    arms = [expert_episode(EnvConfig(name="bandit", max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1),
                           s, rng)["success"] for s in range(400)]
    assert 0.4 < sum(arms) / 400 < 0.6                 # both arms: the warm-up does not know the good name
    lake = [expert_episode(EnvConfig(name="frozen_lake"), s, rng) for s in range(300)]
    assert all(r["score"] >= 0 for r in lake)           # never format-penalised
    assert 0.15 < sum(r["success"] for r in lake) / 300 < 0.4   # slippery: shortest paths often fail


def test_bandit_seed_fixes_the_draw_within_a_group():
    # as in RAGEN (gym's np_random seeded by reset): every pull of an arm from one start state pays the same
    env = make_env("bandit")
    pays = set()
    for _ in range(20):
        env.reset(7)
        pays.add(env.step(["Dragon"]).reward)
    assert len(pays) == 1

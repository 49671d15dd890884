"""Environment rollout: the policy plays a batch of episodes turn by turn, ids appended as it goes.

For every start seed, ``n_samples`` episodes (one group) are played. Each round, every live
episode asks the engine for one assistant turn (one batched ``generate``); the turn's text is
parsed and applied by ``Episode.play`` (RAGEN's rules); the next observation is appended as
injected ids (mask 0)::

    GENERATE ──turn──▶ Episode.play ──next user message──▶ append observation ids ──▶ GENERATE
                              │ game over / budgets / context full
                              ▼
                           finished (score = game rewards + format penalties, on the last token)

A turn cut by the token budget is closed with an injected end-of-turn token (mask 0) and parsed
like any other (it usually has no ``</answer>``: a format-penalised no-op). When the response would
outgrow ``max_response_tokens`` the episode stops with reason ``length`` (not a success). With a
continuous-batching engine (``engine.stream``) a turn is submitted as soon as its episode is ready
and the episode's cached prefix is reused; otherwise all live episodes generate in rounds.
``turn_spans`` record where each assistant turn's generated ids lie, for the MI probe.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tqdm.auto import tqdm

from models.engine import Engine, GenOutput, GenRequest
from tasks.envs.base import make_env
from tasks.envs.config import EnvConfig
from tasks.envs.episode import Episode
from tasks.envs.tokens import EnvChat


@dataclass
class EnvTrajectory:
    traj_id: str
    group: str
    sample_idx: int
    episode: Episode
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    finish_reason: str = ""

    def append(self, ids: list[int], mask: int, lps: list[float] | None = None) -> None:
        self.response_ids += ids
        self.response_mask += [mask] * len(ids)
        self.logprobs += lps if lps is not None else [0.0] * len(ids)

    @property
    def live(self) -> bool:
        return not self.finish_reason


def group_id(env_name: str, seed: int) -> str:
    """The prompt-group id of a start state: every sample of one seed shares it."""
    return f"{env_name}:{seed}"


class EnvRollout:
    """Plays one step's episodes (see module docstring)."""

    def __init__(self, cfg: EnvConfig, engine: Engine, chat: EnvChat, n_samples: int, max_new_tokens: int,
                 max_response_tokens: int, env_name: str | None = None):
        self.cfg, self.engine, self.chat = cfg, engine, chat
        self.n_samples, self.max_new_tokens, self.max_response_tokens = n_samples, max_new_tokens, max_response_tokens
        self.env_name = env_name or cfg.name

    def new_trajectories(self, seeds: list[int], step: int) -> list[EnvTrajectory]:
        out = []
        for seed in seeds:
            gid = group_id(self.env_name, seed)
            for k in range(self.n_samples):
                ep = Episode(make_env(self.env_name, **self.cfg.options), self.cfg, seed)
                msgs = ep.messages()
                out.append(EnvTrajectory(f"{step}:{gid}:{k}", gid, k, ep, self.chat.prompt_ids(msgs), messages=msgs))
        return out

    def request(self, t: EnvTrajectory) -> GenRequest:
        room = self.max_response_tokens - len(t.response_ids)
        return GenRequest(t.prompt_ids + t.response_ids, max(1, min(self.max_new_tokens, room)))

    def run(self, seeds: list[int], seed: int, step: int, progress: bool = True) -> list[EnvTrajectory]:
        trajs = self.new_trajectories(seeds, step)
        bar = tqdm(total=len(trajs), desc=f"{self.env_name} step {step}", disable=None if progress else True,
                   leave=False)  # disable=None: drawn only on a terminal
        batching = getattr(getattr(self.engine, "cfg", None), "batching", "continuous")
        if callable(getattr(self.engine, "stream", None)) and batching == "continuous":
            self._run_stream(trajs, seed, step, bar)
        else:
            self._run_rounds(trajs, seed, step, bar)
        bar.close()
        return trajs

    def _run_rounds(self, trajs: list[EnvTrajectory], seed: int, step: int, bar) -> None:
        """Every live episode's next turn in one ``generate`` per round."""
        round_ = 0
        while live := [t for t in trajs if t.live]:
            outs = self.engine.generate([self.request(t) for t in live], seed=hash((seed, step, round_)) % 2**31)
            for t, out in zip(live, outs):
                self.on_generated(t, out)
            bar.update(sum(not t.live for t in trajs) - bar.n)
            round_ += 1

    def _run_stream(self, trajs: list[EnvTrajectory], seed: int, step: int, bar) -> None:
        """Continuous batching: a turn is submitted as soon as its episode is ready; each episode's
        cached prefix is reused, so a new turn feeds only the observation."""
        stream = self.engine.stream(hash((seed, step)) % 2**31, keep_prefix=True)
        by_key = {t.traj_id: t for t in trajs}
        for t in trajs:
            req = self.request(t)
            stream.submit(t.traj_id, req.input_ids, req.max_new_tokens)
        while stream.busy:
            for key, ids, lps, reason in stream.step():
                t = by_key[key]
                self.on_generated(t, GenOutput(ids, lps, reason))
                if t.live:
                    req = self.request(t)
                    stream.submit(key, req.input_ids, req.max_new_tokens)
                else:
                    stream.release(key)
                    bar.update(1)

    def on_generated(self, t: EnvTrajectory, out: GenOutput) -> None:
        """One assistant turn arrived: record its ids, play it, append the next observation or finish."""
        start = len(t.response_ids)
        t.append(out.token_ids, 1, out.logprobs)
        t.turn_spans.append((start, len(t.response_ids)))
        if out.finish_reason == "length":
            t.append([self.chat.eos_id], 0)
        text = self.chat.turn_text(out.token_ids)
        t.messages.append({"role": "assistant", "content": text})
        nxt = t.episode.play(text)
        if nxt is None:
            t.finish_reason = t.episode.finish_reason
            return
        obs = self.chat.observation_ids(nxt)
        if len(t.response_ids) + len(obs) >= self.max_response_tokens:
            t.episode.stop("length")
            t.finish_reason = "length"
            return
        t.append(obs, 0)
        t.messages.append({"role": "user", "content": nxt})

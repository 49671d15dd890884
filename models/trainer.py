"""Policy update: the DAPO loss on final (purified) token sequences.

One call of ``update`` is one RL step on the policy side:

1. load the policy from a ``save_pretrained`` checkpoint folder (and its optimizer state);
2. **recompute old log-probs** on the final sequences (no grad; ``models.old_logprobs``) — SAAR changed the context
   the rollout log-probs were computed in, so they are never used as the old policy; with
   ``fuse_old_logprobs`` the first mini-batch's forwards (with grad, before any optimizer step) are its
   rows' old log-probs and the update reuses them, so only the other rows get the no-grad pass (only when that
   mini-batch is one micro-batch: fused graphs are held until its step)
   (``causal_only`` and ``response_logits`` trim every forward: no padding mask, no prompt logits;
   ``share_prompts`` forwards each distinct prompt once, ``models.forward``, but not in train mode when the model
   has dropout: one prompt forward would give its rows one dropout mask); the splice
   treatment ``cfg.splice`` (``models.splice``) then decides how the spliced tokens train (``full``: like the
   others; ``mask``: cut like a response mask — before the ESS weights and GAE, and a row left with nothing to train
   is dropped; ``truncated_is``: weights in the policy loss's numerator only; ``behaviour_old``; any but ``full``
   turns the fusion off) and logs ``splice/*``; ``behaviour_is_cap`` multiplies every trained token's weight by
   min(cap, π_old/π_behaviour) (``models.behaviour``, the bounded-staleness loss of docs/rl_rules.md), and the
   rows' ``sampled_version`` give ``perf/staleness_mean`` / ``_max`` against the version ``ckpt_dir`` holds;
3. for each mini-batch: the registered loss ``cfg.loss`` (``models.losses``: ``dapo`` =
   -min(ratio·A, clip(ratio, 1-ε_low, 1+ε_high)·A) with ratio = exp(new - old), ``opmd`` =
   -A·log π / (1 + τ)), token-mean over the mini-batch's mask-1 tokens (``loss_agg``: or the mean over its
   sequences of each sequence's token-mean); with ``kl_coef > 0``
   plus ``kl_coef`` × a KL estimate to the reference policy (log-probs computed once, like the
   old ones); gradient-norm clip, AdamW step; reported besides: the policy entropy and the approx KL
   mean(old − new) on the trained tokens. VCPO (``models.vcpo``): the ESS ratio of the mini-batch's
   sequence importance weights (old vs the engine's rollout log-probs) is reported (``train/ess_ratio``)
   and, with ``lr_scale``, scales that step's learning rate (restored after); ``opob`` replaces the
   advantages by reward minus the optimal off-policy baseline (per-row gradients, whole groups per
   mini-batch); with either on, a row without rollout log-probs is an error naming it (never w = 1);
   With the critic (``trainer.critic.enabled``, set by ``mix.advantage: gae``; ``models.critic``) a value
   head on the policy gives per-token GAE advantages (from the values before the update, like the old
   log-probs) and adds ``value_coef`` × its value loss; the head and its optimizer live in ``critic.pt``;
4. write the next checkpoint folder (weights, tokenizer, optimizer, trainer state) to a
   temporary folder and rename it, so a crash never leaves a half-written checkpoint (``models.checkpoint``).

A checkpoint may be a LoRA adapter on a frozen base (``models.lora``): then only the adapter trains
(the optimizer sees its parameters only), the base is loaded once per process and shared by every
update, and the checkpoint written is an adapter folder pointing at the same base.

Simplifications: one process, float32, gradient accumulation over micro-batches.
"""

from __future__ import annotations

import random
from contextlib import nullcontext
from pathlib import Path

import torch

from models.behaviour import behaviour_weights, staleness_metrics
from models.checkpoint import Commit, policy_version, save_checkpoint
from models.config import TrainerConfig
from models.critic import load_critic, token_gae, whiten
from models.engine import load_causal_lm
from models.forward import (
    ForwardSwitches,
    SharedPrompts,
    micro_spans,
    response_logprobs_entropy,
)
from models.forward import response_forward as _response_forward
from models.lora import is_adapter, trainable_parameters, trainable_policy
from models.losses import LossBatch, get_loss, kl_penalty
from models.old_logprobs import first_forwards, fusable, micro_order, old_logprobs, random_in_train
from models.samples import Sample
from models.splice import trains, treat_rows
from models.vcpo import ess_ratio, get_lr_scale, opob_baseline, seq_log_weights


def dapo_loss(new_lp, old_lp, adv, mask, clip_low: float, clip_high: float, n_tokens: float):
    """The DAPO clipped surrogate (kept for callers of the old signature; the trainer uses ``models.losses``)."""
    cfg = type("Clip", (), {"clip_low": clip_low, "clip_high": clip_high})
    loss, stats = get_loss("dapo")(LossBatch(new_lp, old_lp, adv, mask, n_tokens), cfg)
    return loss, stats["clipped"], stats["ratio"]


def update(ckpt_dir: Path, samples: list[Sample], cfg: TrainerConfig, out_dir: Path, pad_id: int, seed: int,
           state: dict | None = None, on_step=None, ref_dir: Path | None = None, commit: Commit = nullcontext) -> dict:
    """One RL update from ``ckpt_dir`` on ``samples``; writes ``out_dir`` (swapped in inside ``commit``, see
    ``models.checkpoint``); returns ``train/*`` metrics.

    ``state`` is stored in the checkpoint's ``trainer_state.json``; ``on_step`` is called after
    every optimizer step (fault injection uses it); ``ref_dir`` is the KL reference policy
    (required when ``cfg.kl_coef > 0``).
    """
    model, opt, critic = _load(ckpt_dir, cfg, seed)
    samples = [s for s in samples if trains(s.response_mask, s.spliced, cfg.splice)]
    if not samples:
        raise ValueError(f"update: no row has a token to train (trainer.splice={cfg.splice!r}); a step with none "
                         "copies the policy instead (tasks.training.stages.update_stage)")
    rng = random.Random(seed)
    epochs = [_minibatches(samples, cfg, rng) for _ in range(cfg.epochs)]  # the same draws as epoch by epoch
    share = ForwardSwitches.of(cfg).share_prompts and critic is None and not random_in_train(model)
    first = micro_order(samples, epochs[0][0], share) if fusable(model, cfg, critic is not None) else []
    if len(micro_spans([samples[i] for i in first], cfg.micro_batch, cfg.micro_tokens, share)) > 1:
        first = []  # fused, every micro-batch's graph would stay alive until the step: micro-batching's bound lost
    forwards, recomputed, t_old, first_prompts = first_forwards(model, samples, first, pad_id, cfg)
    samples, old, weights, splice_stats = treat_rows(samples, recomputed, cfg)  # masks cut: ESS and GAE see them
    weights, is_stats = behaviour_weights(samples, recomputed, weights, cfg)
    stale = staleness_metrics(samples, policy_version(ckpt_dir)) if any(s.sampled_version for s in samples) else {}
    targets = _critic_targets(model, critic[0], samples, pad_id, cfg) if critic is not None else None
    ref = _reference_logprobs(ref_dir, samples, pad_id, cfg) if cfg.kl_coef > 0 else None
    model.train()
    totals = {"loss": 0.0, "grad_norm": 0.0, "clipped": 0.0, "ratio": 0.0, "tokens": 0.0, "kl": 0.0, "entropy": 0.0,
              "approx_kl": 0.0, "value_loss": 0.0, "value": 0.0}
    log_w = _log_weights(samples, recomputed, required=cfg.lr_scale != "none" or cfg.opob)
    lr_rule, ess_seen = get_lr_scale(cfg.lr_scale), []
    n_steps = 0
    for minibatches in epochs:
        for mb in minibatches:
            rho = ess_ratio(log_w[mb]) if log_w is not None else None
            scale = lr_rule(rho, cfg.ess_rho_base) if rho is not None else 1.0
            if rho is not None:
                ess_seen.append((rho, scale))
            if cfg.opob:
                _opob_step(model, opt, [samples[i] for i in mb], [old[i] for i in mb],
                           [ref[i] for i in mb] if ref is not None else None, cfg, pad_id, totals,
                           log_w[mb] if log_w is not None else None, scale)
            else:
                mb = micro_order(samples, mb, share)
                fused = n_steps == 0 and mb == first
                _minibatch_step(model, opt, [samples[i] for i in mb], [old[i] for i in mb],
                                [ref[i] for i in mb] if ref is not None else None, cfg, pad_id, totals,
                                log_w[mb] if log_w is not None else None, scale,
                                critic=critic, targets=[targets[i] for i in mb] if targets is not None else None,
                                weights=[weights[i] for i in mb],
                                forwards=forwards if fused else None, prompts=first_prompts if fused else None)
            n_steps += 1
            if on_step is not None:
                on_step()
    model.eval()
    save_checkpoint(model, ckpt_dir, out_dir, opt, state, critic=critic, commit=commit)
    return {**_ess_metrics(ess_seen), **_critic_metrics(totals, n_steps, samples, targets), **splice_stats,
            **is_stats, **stale,
            **_train_metrics(totals, n_steps, len(samples), cfg.epochs, ref is not None), "time/old_logprobs_s": t_old}


def _train_metrics(totals: dict, n_steps: int, n_samples: int, epochs: int, with_kl: bool) -> dict:
    """``train/*`` of an update: loss, gradient norm and KL a mini-batch; clip fraction, ratio, entropy and
    approximate KL a trained token; trained tokens an epoch."""
    tokens = max(totals["tokens"], 1.0)
    return {
        "train/loss": totals["loss"] / max(n_steps, 1),
        "train/grad_norm": totals["grad_norm"] / max(n_steps, 1),
        "train/clip_frac": totals["clipped"] / tokens,
        "train/ratio_mean": totals["ratio"] / tokens,
        "train/entropy": totals["entropy"] / tokens,
        "train/approx_kl": totals["approx_kl"] / tokens,
        "train/tokens": totals["tokens"] / epochs,
        **({"train/kl": totals["kl"] / max(n_steps, 1)} if with_kl else {}),
        "train/sequences": n_samples,
        "train/optimizer_steps": n_steps,
    }


def _load(ckpt_dir: Path, cfg: TrainerConfig, seed: int):
    """The policy of ``ckpt_dir`` (a LoRA adapter on its frozen base, or a full model), its AdamW with the saved
    state, and its critic when ``cfg.critic`` is on; torch is seeded after loading (a first load draws random
    initial weights, a cached base does not)."""
    if cfg.device == "cpu":
        torch.set_num_threads(cfg.threads)
    model = trainable_policy(ckpt_dir, cfg.device) if is_adapter(ckpt_dir) else load_causal_lm(ckpt_dir, cfg.device)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(trainable_parameters(model), lr=cfg.lr, weight_decay=cfg.weight_decay)
    opt_path = Path(ckpt_dir) / "optimizer.pt"
    if opt_path.exists():
        opt.load_state_dict(torch.load(opt_path, weights_only=True))
    get_loss(cfg.loss)
    critic = load_critic(ckpt_dir, model, cfg.critic.lr, cfg.device) if cfg.critic.enabled else None
    if critic is not None and cfg.opob:
        raise ValueError("trainer.opob and the critic (mix.advantage: gae) exclude each other")
    return model, opt, critic


def _ess_metrics(ess_seen: list[tuple[float, float]]) -> dict:
    """VCPO's mean and smallest ESS ratio over the mini-batches and the mean learning-rate factor it gave."""
    if not ess_seen:
        return {}
    return {"train/ess_ratio": sum(r for r, _ in ess_seen) / len(ess_seen),
            "train/ess_ratio_min": min(r for r, _ in ess_seen),
            "train/lr_scale": sum(f for _, f in ess_seen) / len(ess_seen)}


def _critic_metrics(totals: dict, n_steps: int, samples: list[Sample], targets) -> dict:
    """The critic's value loss, mean value and mean return over trained tokens (nothing without a critic)."""
    if targets is None:
        return {}
    trained = max(sum(sum(s.response_mask) for s in samples), 1)
    return {"train/value_loss": totals["value_loss"] / max(n_steps, 1),
            "train/value_mean": totals["value"] / max(totals["tokens"], 1.0),
            "train/return_mean": float(trained_return_sum(samples, targets)) / trained}


def trained_return_sum(samples: list[Sample], targets) -> torch.Tensor:
    """The sum of the GAE returns over every sample's trained (mask-1) tokens, on the returns' device (the masks are
    built there: a CPU mask times a GPU tensor raises)."""
    return torch.stack([(r * torch.tensor(s.response_mask, dtype=r.dtype, device=r.device)).sum()
                        for s, (_, r) in zip(samples, targets)]).sum()


def _split(order: list, parts: int) -> list[list]:
    parts = min(parts, len(order))
    size = -(-len(order) // parts)
    return [order[i : i + size] for i in range(0, len(order), size)]


def _minibatches(samples: list[Sample], cfg: TrainerConfig, rng: random.Random) -> list[list[int]]:
    """One epoch's mini-batches of sample indices, shuffled; with OPOB whole groups (its baseline is per group)."""
    if not cfg.opob:
        order = list(range(len(samples)))
        rng.shuffle(order)
        return _split(order, cfg.mini_batches)
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(s.group, []).append(i)
    keys = sorted(groups)
    rng.shuffle(keys)
    return [[i for g in part for i in groups[g]] for part in _split(keys, cfg.mini_batches)]


def _log_weights(samples: list[Sample], old: list[torch.Tensor], required: bool = False) -> torch.Tensor | None:
    """VCPO's sequence log importance weights (recomputed old vs rollout log-probs). Rows without rollout
    log-probs (or with a count that does not match their response): an error naming them when VCPO needs the
    weights (``required``), else None (no ``train/ess_ratio``)."""
    bad = [i for i, s in enumerate(samples) if s.rollout_lp is None or len(s.rollout_lp) != len(s.response_ids)]
    if bad and required:
        names = ", ".join(f"{samples[i].row_id or f'#{i}'} ({_lp_count(samples[i])})" for i in bad[:10])
        raise ValueError(f"trainer.lr_scale / trainer.opob (VCPO) need the rollout log-probs of every row; "
                         f"{len(bad)} of {len(samples)} rows lack them: {names}")
    if bad:
        return None
    def like(values, o: torch.Tensor) -> torch.Tensor:  # on the old log-probs' device (a GPU in a real run)
        return torch.tensor(values, dtype=o.dtype, device=o.device)

    return seq_log_weights(old, [like(s.rollout_lp, o) for s, o in zip(samples, old)],
                           [like(s.response_mask, o) for s, o in zip(samples, old)])


def _lp_count(s: Sample) -> str:
    return "no rollout log-probs" if s.rollout_lp is None else f"{len(s.rollout_lp)} log-probs for {len(s.response_ids)} tokens"


def _optimizer_step(model, opt, cfg: TrainerConfig, lr_scale: float) -> float:
    """Clip the gradient and step with the learning rate times ``lr_scale``, restored afterwards (VCPO)."""
    grad_norm = torch.nn.utils.clip_grad_norm_(trainable_parameters(model), cfg.grad_clip)
    base = [group["lr"] for group in opt.param_groups]
    for group in opt.param_groups:
        group["lr"] *= lr_scale
    opt.step()
    for group, lr in zip(opt.param_groups, base):
        group["lr"] = lr
    return float(grad_norm)


@torch.no_grad()
def _critic_targets(model, head, samples: list[Sample], pad_id: int, cfg: TrainerConfig):
    """Per sample (advantages, returns) ``[len(response)]``: GAE on the values before the update, the sample's
    ``advantage`` (the ``gae`` estimator's outcome reward) on its last trained token; whitened with
    ``critic.whiten``."""
    model.eval()
    values: list[torch.Tensor] = []
    for lo in range(0, len(samples), cfg.micro_batch):
        chunk = samples[lo : lo + cfg.micro_batch]
        _, _, _, v = _response_forward(model, chunk, pad_id, cfg.device, head)
        values.extend(v[i, : len(s.response_ids)].detach() for i, s in enumerate(chunk))
    masks = [torch.tensor(s.response_mask, dtype=v.dtype, device=v.device) for s, v in zip(samples, values)]
    pairs = [token_gae(s.advantage, v, m, cfg.critic.gamma, cfg.critic.lam) for s, v, m in zip(samples, values, masks)]
    adv = [a for a, _ in pairs]
    if cfg.critic.whiten:
        adv = whiten(adv, masks)
    return [(a, r) for a, (_, r) in zip(adv, pairs)]


@torch.no_grad()
def _reference_logprobs(ref_dir: Path | None, samples: list[Sample], pad_id: int, cfg: TrainerConfig):
    if ref_dir is None:
        raise ValueError("trainer.kl_coef > 0 needs a reference policy, but update() got no ref_dir")
    return old_logprobs(load_causal_lm(ref_dir, cfg.device), samples, pad_id, cfg)


def _stack(rows: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(like)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def _minibatch_step(model, opt, mb: list[Sample], old: list[torch.Tensor], ref: list[torch.Tensor] | None,
                    cfg: TrainerConfig, pad_id: int, totals: dict, log_w: torch.Tensor | None = None,
                    lr_scale: float = 1.0, critic=None, targets: list | None = None,
                    weights: list[torch.Tensor] | None = None, forwards: list | None = None,
                    prompts: SharedPrompts | None = None):
    """One optimizer step on a mini-batch; with a ``critic`` (head, optimizer) the advantages are the per-token
    GAE ``targets`` (advantage, return) and the value loss is added; ``weights`` (``models.splice``) scale
    each row's tokens in the policy loss's numerator only (``LossBatch.weight``). ``forwards``: this mini-batch's forwards per micro-batch, already run
    (``models.old_logprobs.first_forwards``), and ``prompts`` the shared prompts they attend to. With ``trainer.share_prompts`` (no
    critic) the micro-batches attend to the mini-batch's prompts forwarded once (``models.forward``)."""
    n_tokens = float(sum(sum(s.response_mask) for s in mb)) or 1.0
    if prompts is None and forwards is None and critic is None and ForwardSwitches.of(cfg).share_prompts \
            and not random_in_train(model):
        prompts = SharedPrompts(model, mb, pad_id, cfg.device)
    loss_fn = get_loss(cfg.loss)
    opt.zero_grad(set_to_none=True)
    if critic is not None:
        critic[1].zero_grad(set_to_none=True)
    loss_sum = 0.0
    spans = micro_spans(mb, cfg.micro_batch, cfg.micro_tokens, prompts is not None)
    for k, (lo, hi) in enumerate(spans):
        chunk = mb[lo:hi]
        if forwards:
            new_lp, mask, entropy, values = forwards[k]
        elif prompts is not None:
            new_lp, mask, entropy, values = prompts.forward(chunk)
        else:
            new_lp, mask, entropy, values = _response_forward(model, chunk, pad_id, cfg.device, critic[0] if critic
                                                              else None, cfg.critic.detach_trunk, ForwardSwitches.of(cfg))
        if targets is None:
            adv = torch.tensor([s.advantage for s in chunk], device=new_lp.device)
        else:
            adv = _stack([t[0] for t in targets[lo:hi]], new_lp)
        batch = LossBatch(new_lp, _stack(old[lo:hi], new_lp), adv, mask, n_tokens,
                          _stack(ref[lo:hi], new_lp) if ref is not None else None, cfg.loss_agg, float(len(mb)),
                          _stack(weights[lo:hi], new_lp) if weights is not None else None)
        loss, stats = loss_fn(batch, cfg)
        if values is not None:
            returns = _stack([t[1] for t in targets[lo:hi]], new_lp)
            value_loss = batch.aggregate(0.5 * (values - returns).square())
            loss = loss + cfg.critic.value_coef * value_loss
            totals["value_loss"] += value_loss.item()
            totals["value"] += float((values.detach() * mask).sum())
        if ref is not None:
            kl = kl_penalty(batch, cfg.kl_estimator)
            loss = loss + cfg.kl_coef * kl
            totals["kl"] += kl.item()
        loss.backward()
        loss_sum += loss.item()
        totals["clipped"] += stats["clipped"].item()
        totals["ratio"] += stats["ratio"].item()
        totals["entropy"] += float((entropy * mask).sum())
        totals["approx_kl"] += float(((batch.old_lp - new_lp.detach()) * mask).sum())
    if prompts is not None:
        prompts.backward()
    totals["grad_norm"] += _optimizer_step(model, opt, cfg, lr_scale)
    if critic is not None:
        torch.nn.utils.clip_grad_norm_(critic[0].parameters(), cfg.grad_clip)
        critic[1].step()
    totals["loss"] += loss_sum
    totals["tokens"] += n_tokens


def _opob_step(model, opt, mb: list[Sample], old: list[torch.Tensor], ref: list[torch.Tensor] | None,
               cfg: TrainerConfig, pad_id: int, totals: dict, log_w: torch.Tensor | None, lr_scale: float):
    """One optimizer step on Σ_i (r_i − b_group)·g_i (VCPO's OPOB): one backward per row with advantage 1 gives
    g_i; Σ r_i g_i and Σ g_i are accumulated per group and combined once the group's baseline is known."""
    n_tokens = float(sum(sum(s.response_mask) for s in mb)) or 1.0
    loss_fn = get_loss(cfg.loss)
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(mb):
        groups.setdefault(s.group, []).append(i)
    for rows in groups.values():
        rewards = [mb[i].reward for i in rows]
        std = torch.tensor(rewards).std(unbiased=False).item() if len(rows) > 1 else 0.0
        unit = 1.0 / std if cfg.opob_norm_by_std and std > 1e-8 else 1.0
        with_r, plain, sq_norms, losses = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params], [], []
        for i in rows:
            opt.zero_grad(set_to_none=True)
            new_lp, mask, entropy = response_logprobs_entropy(model, [mb[i]], pad_id, cfg.device)
            batch = LossBatch(new_lp, _stack([old[i]], new_lp), torch.ones(1, device=new_lp.device), mask, n_tokens,
                              agg=cfg.loss_agg, n_seqs=float(len(mb)))
            loss, stats = loss_fn(batch, cfg)
            loss.backward()
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            sq_norms.append(float(sum((g * g).sum() for g in grads)))
            losses.append(loss.item())
            for acc, acc1, g in zip(with_r, plain, grads):
                acc.add_(g, alpha=mb[i].reward * unit)
                acc1.add_(g, alpha=unit)
            totals["clipped"] += stats["clipped"].item()
            totals["ratio"] += stats["ratio"].item()
            totals["entropy"] += float((entropy * mask).sum())
            totals["approx_kl"] += float(((batch.old_lp - new_lp.detach()) * mask).sum())
        lw = [float(log_w[i]) for i in rows] if log_w is not None else [0.0] * len(rows)
        b = opob_baseline(sq_norms, lw, rewards)
        for acc, a, a1 in zip(total, with_r, plain):
            acc.add_(a - b * a1)
        totals["loss"] += sum((r - b) * unit * x for r, x in zip(rewards, losses))
    opt.zero_grad(set_to_none=True)
    if ref is not None:
        _kl_backward(model, mb, old, ref, cfg, pad_id, n_tokens, totals)
    for p, g in zip(params, total):
        p.grad = g if p.grad is None else p.grad + g
    totals["grad_norm"] += _optimizer_step(model, opt, cfg, lr_scale)
    totals["tokens"] += n_tokens


def _kl_backward(model, mb: list[Sample], old, ref, cfg: TrainerConfig, pad_id: int, n_tokens: float, totals: dict):
    """Backward of ``kl_coef`` × the KL penalty over a mini-batch (used where the policy loss is built per row)."""
    for lo in range(0, len(mb), cfg.micro_batch):
        chunk = mb[lo : lo + cfg.micro_batch]
        new_lp, mask, _ = response_logprobs_entropy(model, chunk, pad_id, cfg.device)
        batch = LossBatch(new_lp, _stack(old[lo : lo + cfg.micro_batch], new_lp), torch.zeros(len(chunk)), mask,
                          n_tokens, _stack(ref[lo : lo + cfg.micro_batch], new_lp), cfg.loss_agg, float(len(mb)))
        kl = kl_penalty(batch, cfg.kl_estimator)
        (cfg.kl_coef * kl).backward()
        totals["kl"] += kl.item()

"""What the update holds in memory, and dropout with shared prompts (``models.trainer``).

* micro-batching bounds the activations the update keeps for backward, also with ``fuse_old_logprobs`` (on by
  default): measured as the peak bytes of tensors saved for backward (``torch.autograd.graph.saved_tensors_hooks``)
  and alive at once — at ``micro_batch=2`` a fraction of one 16-row micro-batch's, not all of it (the first
  mini-batch used to keep every micro-batch's graph until its step: 221 MiB vs 31 MiB);
* with LoRA dropout > 0 a prompt forwarded once for its rows would give them one dropout mask: the update forwards
  each row whole, so ``share_prompts`` on and off train the same adapter.

Run: ``pytest tests/test_update_memory.py``.
"""

from __future__ import annotations

import gc
import weakref

import torch

from models.config import LoraSpec, TrainerConfig
from models.lora import add_lora, copy_tokenizer, load_policy
from models.trainer import Sample, update


class _Saved:
    """One tensor saved for backward; freed with the graph that holds it."""

    def __init__(self, t: torch.Tensor):
        self.t = t


class SavedBytes:
    """Bytes of the tensors autograd saved for backward that are still alive, and their peak."""

    def __init__(self):
        self.live = self.peak = 0

    def pack(self, t: torch.Tensor) -> _Saved:
        n = t.numel() * t.element_size()
        self.live += n
        self.peak = max(self.peak, self.live)
        saved = _Saved(t)
        weakref.finalize(saved, self._free, n)
        return saved

    def unpack(self, saved: _Saved) -> torch.Tensor:
        return saved.t

    def _free(self, n: int) -> None:
        self.live -= n


def _rows(chat, n: int = 16) -> list[Sample]:
    prompts = [chat.prompt_ids([{"role": "user", "content": f"What is {x} * 3? Show the steps."}]) for x in range(4)]
    texts = [f"Step {k}: {x} * 3 = {3 * x}, so the answer is \\boxed{{{3 * x}}}." * (1 + k % 3)
             for k, x in enumerate(range(n))]
    return [Sample(prompts[k % 4], chat.encode(t) + [chat.eos_id], [1] * (len(chat.encode(t)) + 1),
                   1.0 if k % 2 else -1.0) for k, t in enumerate(texts)]


def _peak(warm_model_dir, chat, tmp_path, micro_batch: int) -> int:
    meter = SavedBytes()
    cfg = TrainerConfig(lr=1e-4, mini_batches=1, micro_batch=micro_batch, fuse_old_logprobs=True)
    with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
        update(warm_model_dir, _rows(chat), cfg, tmp_path / f"mb{micro_batch}", chat.tokenizer.pad_token_id, seed=0)
    gc.collect()
    assert meter.live < meter.peak / 5, (meter.live, meter.peak)  # the graphs were freed: the meter sees frees
    return meter.peak


def test_micro_batches_bound_saved_activations_with_fused_old_logprobs(warm_model_dir, chat, tmp_path):
    whole, micro = _peak(warm_model_dir, chat, tmp_path, 16), _peak(warm_model_dir, chat, tmp_path, 2)
    print(f"peak saved-for-backward bytes, 16 rows: micro_batch 16 {whole / 2**20:.1f} MiB, micro_batch 2 "
          f"{micro / 2**20:.1f} MiB (ratio {micro / whole:.2f})")
    assert micro < 0.4 * whole


def test_lora_dropout_forwards_each_row_whole_so_shared_prompts_change_nothing(warm_model_dir, chat, tmp_path,
                                                                             monkeypatch):
    """The gradients of every optimizer step with ``share_prompts`` on and off (Adam's first steps would turn float
    rounding on near-zero gradients into ±lr, so the gradients are compared, not the weights)."""
    from models import trainer

    torch.manual_seed(0)
    model = add_lora(load_policy(warm_model_dir), LoraSpec(r=4, dropout=0.3, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    model.save_pretrained(tmp_path / "adapter")
    copy_tokenizer(warm_model_dir, tmp_path / "adapter")
    grads: dict[bool, list[torch.Tensor]] = {True: [], False: []}
    real_step = trainer._optimizer_step
    rows = _rows(chat, 8)
    for share in (True, False):
        def recording_step(model, opt, cfg, lr_scale, into=grads[share]):
            into.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
            return real_step(model, opt, cfg, lr_scale)

        monkeypatch.setattr(trainer, "_optimizer_step", recording_step)
        cfg = TrainerConfig(lr=1e-2, mini_batches=2, micro_batch=2, share_prompts=share)
        update(tmp_path / "adapter", rows, cfg, tmp_path / f"share-{share}", chat.tokenizer.pad_token_id, seed=0)
    assert len(grads[True]) == len(grads[False]) == 2
    for on, off in zip(grads[True], grads[False]):
        apart = float((on - off).abs().max() / off.abs().max())
        assert apart < 1e-4, apart  # float rounding of the old log-probs' shared prompts, not other dropout masks

"""GPU check: the tiny model's decode and one policy update on a device, checked against the CPU.

For the day an accelerator is lent: ``python -m models.gpu_check --device cuda`` needs only torch, transformers
and pydantic (what such a machine usually has; peft, polars, the stores and the sandbox are never imported). It
runs the project's own code paths — ``models.decode.DecodeStream`` (the in-process engine's continuous batch,
preallocated cache, lean decode step) and ``models.trainer.update`` (one RL update, checkpoint written) — once on
the CPU and once on ``--device``, and checks:

1. **greedy decode** (temperature 0: the arg-max, its log-prob at temperature 1) of ``rows`` prompts for up to
   ``tokens`` tokens each: the token ids are equal. A row may part from the CPU's only where the CPU's two best
   logits at the first differing position are closer than ``tie_gap`` (float rounding deciding a tie is not a
   bug; such rows are counted and printed). The log-probs of every common prefix agree within ``lp_tol``.
2. **sampled decode** (temperature 1, the engine's seeded per-row draws, made on the CPU): it runs on the device;
   how many rows sampled the same ids as the CPU's is printed (a near-tie of the cumulative distribution may
   flip a token; not checked).
3. **one update** from the model on the CPU's greedy rows (advantages ±1, the rollout log-probs attached): every
   ``train/*`` figure within ``metric_rtol`` (relative) + ``metric_atol``; the device **applied the CPU's update**:
   its weight change (new − start, every tensor) is within ``update_rtol`` of the CPU's in L2 norm, relative to the
   CPU's, and the CPU's is not zero — a skipped update is 1 away, a negated one 2, a doubled one 1 (Adam moves every
   weight by ≈ lr whatever its gradient, so comparing the new weights alone, whose gap a skipped update keeps
   within 2 × lr, cannot tell); and no weight of the two new checkpoints further apart than Adam's step bound,
   2 × lr × optimizer steps.

It prints tokens/s of both decodes and the update's wall time on each side, and exits 1 when a check fails.
With ``--device cpu`` (``tests/test_gpu_check.py``, in ``make test``) both sides are the CPU: the code path cannot
rot between lendings. ``--json PATH`` writes the figures. On a machine without pydantic, carry its wheel (and
pydantic-core's, typing-inspection's, annotated-types') and ``pip install --no-deps`` them first.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

QUESTIONS = ("What is 17 + 25?", "Sort the list [3, 1, 2].", "How many primes are below 30?",
             "Compute 12 * 13 with Python.", "Reverse the string 'cleaner'.", "What is 2 ** 10?",
             "Sum the digits of 98765.", "Is 221 a prime number?")


class GpuCheckConfig(BaseModel):
    """What ``models.gpu_check`` runs and how close the device must come to the CPU."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    model: str = "assets/tiny-warm"
    """A full model folder (``from_pretrained``) with its tokenizer: the committed tiny policy by default."""
    device: str = "cuda"
    """The torch device checked against the CPU (``cpu`` checks the CPU against itself: the test's way)."""
    rows: int = Field(16, ge=1)
    """Prompts decoded together (the questions repeated with a row number)."""
    tokens: int = Field(48, ge=1)
    """Token budget of each row's decode."""
    tie_gap: float = Field(1e-3, ge=0)
    """A greedy row may part from the CPU's only where the CPU's two best logits are closer than this."""
    lp_tol: float = Field(1e-4, gt=0)
    """Largest absolute difference of a common prefix's log-probs (float32: ~1e-6 expected)."""
    metric_rtol: float = Field(1e-3, gt=0)
    """Relative tolerance of the update's ``train/*`` figures."""
    metric_atol: float = Field(1e-5, gt=0)
    """Absolute tolerance of the update's ``train/*`` figures (for figures near 0)."""
    update_rtol: float = Field(0.25, gt=0)
    """Largest L2 distance between the device's and the CPU's weight changes, relative to the CPU's (a skipped
    update is 1, a negated one 2; float rounding flips Adam's step only on weights with a near-zero gradient)."""
    lr: float = Field(1e-4, gt=0)
    """The update's learning rate."""
    seed: int = 0
    """Sampling seed of the sampled decode and the update's seed."""
    threads: int = Field(1, ge=1)
    """Torch threads on the CPU side."""


@dataclass(frozen=True)
class Decoded:
    """One row of a decode: its ids and their log-probs."""

    ids: list[int]
    lps: list[float]


@dataclass(frozen=True)
class DecodeVerdict:
    """How a device's greedy decode compares with the CPU's."""

    equal_rows: int
    tie_rows: list[tuple[int, int, float]]
    """(row, first differing position, the CPU's top-2 logit gap there) of rows parted at a near-tie."""
    bad_rows: list[tuple[int, int, float]]
    """The same for rows parted where the CPU's choice was clear: a failure."""
    max_lp_diff: float

    def ok(self, lp_tol: float) -> bool:
        return not self.bad_rows and self.max_lp_diff <= lp_tol


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where ``a`` and ``b`` differ (a shorter one ending counts); None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_decodes(ref: list[Decoded], dev: list[Decoded], gap_at, tie_gap: float) -> DecodeVerdict:
    """Compare rows; ``gap_at(row, position)`` is the CPU's top-2 logit gap where the row's ids part."""
    ties, bad, equal, lp_diff = [], [], 0, 0.0
    for r, (a, b) in enumerate(zip(ref, dev, strict=True)):
        at = first_difference(a.ids, b.ids)
        common = len(a.ids) if at is None else at
        lp_diff = max([lp_diff, *(abs(x - y) for x, y in zip(a.lps[:common], b.lps[:common]))])
        if at is None:
            equal += 1
            continue
        gap = gap_at(r, at)
        (ties if gap < tie_gap else bad).append((r, at, gap))
    return DecodeVerdict(equal, ties, bad, lp_diff)


def compare_metrics(ref: dict[str, float], dev: dict[str, float], rtol: float, atol: float) -> list[str]:
    """``train/*`` figures of the two updates that are further apart than ``atol + rtol·|cpu|`` (or missing)."""
    keys = sorted(k for k in ref.keys() | dev.keys() if not k.startswith("time/"))
    return [f"{k}: cpu {ref.get(k)} vs device {dev.get(k)}" for k in keys
            if k not in ref or k not in dev or abs(ref[k] - dev[k]) > atol + rtol * abs(ref[k])]


def prompts(model: str, rows: int) -> list[list[int]]:
    """ChatML prompts of ``rows`` questions (numbered, so no two rows are the same)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    texts = [f"<|im_start|>user\n{QUESTIONS[i % len(QUESTIONS)]} (#{i})<|im_end|>\n<|im_start|>assistant\n"
             for i in range(rows)]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def load(model: str, device: str):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).to(device).eval()


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def decode(model, eos_id: int, pad_id: int, batch: list[list[int]], budget: int, temperature: float,
           seed: int) -> tuple[list[Decoded], float]:
    """The rows' decodes through ``DecodeStream`` (as the engine runs it) and the generated tokens per second."""
    from models.decode import DecodeStream

    device = str(next(model.parameters()).device)
    stream = DecodeStream(model, eos_id, pad_id, temperature, 1.0, len(batch), seed, kv_cache="preallocated",
                          lean_decode=True)
    for i, ids in enumerate(batch):
        stream.submit(i, ids, budget)
    out: dict[int, Decoded] = {}
    _sync(device)
    t0 = time.perf_counter()
    while stream.busy:
        for key, ids, lps, _ in stream.step():
            out[key] = Decoded(list(ids), list(lps))
    _sync(device)
    wall = time.perf_counter() - t0
    return [out[i] for i in range(len(batch))], sum(len(d.ids) for d in out.values()) / wall


def top2_gap(model, prompt: list[int], ids: list[int], at: int) -> float:
    """The gap between the two best logits of ``model`` after ``prompt + ids[:at]``."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + ids[:at]])).logits[0, -1].float()
    best = logits.topk(2).values
    return float(best[0] - best[1])


def run_update(model: str, samples: list, device: str, lr: float, seed: int, out: Path) -> tuple[dict, float]:
    """``models.trainer.update`` on ``device`` from ``model``: its metrics and wall seconds (load, old log-probs,
    optimizer steps, checkpoint written)."""
    from models.config import TrainerConfig
    from models.trainer import update

    _sync(device)
    t0 = time.perf_counter()
    metrics = update(Path(model), samples, TrainerConfig(device=device, lr=lr), out, pad_id=0, seed=seed)
    _sync(device)
    return metrics, time.perf_counter() - t0


def weight_gap(a: Path, b: Path) -> float:
    """The largest absolute difference between the weights of two checkpoint folders."""
    from safetensors.torch import load_file

    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return max(float((wa[k] - wb[k]).abs().max()) for k in wa)


def update_distance(start: Path, a: Path, b: Path) -> tuple[float, float]:
    """(‖Δb − Δa‖ / ‖Δa‖, ‖Δa‖) over all weights, Δx = the weights of checkpoint ``x`` − those of ``start``: how far
    update ``b`` is from update ``a`` (0 the same, 1 skipped, 2 negated), and how far ``a`` moved (inf when it did not)."""
    from safetensors.torch import load_file

    w0, wa, wb = (load_file(str(Path(d) / "model.safetensors")) for d in (start, a, b))
    moved = sum(float((wa[k].double() - w0[k].double()).square().sum()) for k in w0) ** 0.5
    apart = sum(float((wb[k].double() - wa[k].double()).square().sum()) for k in w0) ** 0.5
    return (apart / moved if moved > 0 else float("inf")), moved


def check_decodes(cfg: GpuCheckConfig, cpu, dev, batch: list[list[int]], eos: int, pad: int) -> tuple[dict, bool,
                                                                                                     list[Decoded]]:
    """Greedy and sampled decodes on both sides: the figures, whether the greedy check passed, the CPU's rows."""
    decode(dev, eos, pad, batch[:2], 2, 0.0, cfg.seed)  # warm-up (kernels, allocator)
    ref, cpu_tps = decode(cpu, eos, pad, batch, cfg.tokens, 0.0, cfg.seed)
    got, dev_tps = decode(dev, eos, pad, batch, cfg.tokens, 0.0, cfg.seed)
    verdict = compare_decodes(ref, got, lambda r, at: top2_gap(cpu, batch[r], ref[r].ids, at), cfg.tie_gap)
    ref_s, cpu_s_tps = decode(cpu, eos, pad, batch, cfg.tokens, 1.0, cfg.seed)
    got_s, dev_s_tps = decode(dev, eos, pad, batch, cfg.tokens, 1.0, cfg.seed)
    same = sum(a.ids == b.ids for a, b in zip(ref_s, got_s))
    figures = {"greedy_tokens_per_s": {"cpu": cpu_tps, "device": dev_tps},
               "sampled_tokens_per_s": {"cpu": cpu_s_tps, "device": dev_s_tps},
               "greedy_equal_rows": verdict.equal_rows, "greedy_tie_rows": verdict.tie_rows,
               "greedy_bad_rows": verdict.bad_rows, "greedy_max_lp_diff": verdict.max_lp_diff,
               "sampled_equal_rows": same, "rows": len(batch), "generated": sum(len(d.ids) for d in ref)}
    return figures, verdict.ok(cfg.lp_tol), ref


def check_update(cfg: GpuCheckConfig, batch: list[list[int]], ref: list[Decoded]) -> tuple[dict, bool]:
    """One update on each side from the same model and rows: the figures and whether they agree."""
    from models.trainer import Sample

    samples = [Sample(p, d.ids, [1] * len(d.ids), 1.0 if i % 2 == 0 else -1.0, rollout_lp=d.lps, row_id=f"row{i}")
               for i, (p, d) in enumerate(zip(batch, ref))]
    with tempfile.TemporaryDirectory() as tmp:
        cpu_m, cpu_s = run_update(cfg.model, samples, "cpu", cfg.lr, cfg.seed, Path(tmp) / "cpu")
        dev_m, dev_s = run_update(cfg.model, samples, cfg.device, cfg.lr, cfg.seed, Path(tmp) / "dev")
        gap = weight_gap(Path(tmp) / "cpu", Path(tmp) / "dev")
        distance, moved = update_distance(Path(cfg.model), Path(tmp) / "cpu", Path(tmp) / "dev")
    bound = 2 * cfg.lr * cpu_m["train/optimizer_steps"]
    off = compare_metrics(cpu_m, dev_m, cfg.metric_rtol, cfg.metric_atol)
    figures = {"update_s": {"cpu": cpu_s, "device": dev_s}, "update_metric_mismatches": off,
               "update_weight_gap": gap, "update_weight_bound": bound, "update_distance": distance,
               "update_norm_cpu": moved, "update_metrics_cpu": cpu_m}
    return figures, not off and gap <= bound and distance <= cfg.update_rtol


def gpu_check(cfg: GpuCheckConfig) -> tuple[dict, bool]:
    """Run every check (see module docstring); the figures and whether all passed."""
    import torch

    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    cpu, dev = load(cfg.model, "cpu"), load(cfg.model, cfg.device)
    eos, pad = cpu.generation_config.eos_token_id, cpu.config.pad_token_id or 0
    eos = eos[0] if isinstance(eos, list) else eos
    batch = prompts(cfg.model, cfg.rows)
    figures, decode_ok, ref = check_decodes(cfg, cpu, dev, batch, eos, pad)
    try:
        update_figures, update_ok = check_update(cfg, batch, ref)
    except Exception as err:  # a device error is this check's finding: reported, exit 1
        update_figures, update_ok = {"update_error": f"{type(err).__name__}: {err}"}, False
    name = torch.cuda.get_device_name(0) if cfg.device.startswith("cuda") else cfg.device
    return {"device": name, "torch": torch.__version__, **figures, **update_figures,
            "decode_ok": decode_ok, "update_ok": update_ok}, decode_ok and update_ok


def report(cfg: GpuCheckConfig, f: dict) -> str:
    """The figures as lines a person reads."""
    d, tps, stps = cfg.device, f["greedy_tokens_per_s"], f["sampled_tokens_per_s"]
    return "\n".join([
        f"gpu_check: {cfg.model} on {f['device']} (torch {f['torch']}) against the CPU",
        f"greedy decode, {f['rows']} rows x {cfg.tokens} tokens ({f['generated']} generated): "
        f"{f['greedy_equal_rows']}/{f['rows']} rows equal, parted at a near-tie {f['greedy_tie_rows']}, "
        f"parted at a clear choice {f['greedy_bad_rows']}; log-probs within {f['greedy_max_lp_diff']:.2e} "
        f"(tolerance {cfg.lp_tol:g}) -> {'ok' if f['decode_ok'] else 'FAILED'}",
        f"  tokens/s: cpu {tps['cpu']:.0f}, {d} {tps['device']:.0f}",
        f"sampled decode: {f['sampled_equal_rows']}/{f['rows']} rows the same ids; tokens/s: cpu "
        f"{stps['cpu']:.0f}, {d} {stps['device']:.0f}",
        *_update_lines(d, f),
    ])


def _update_lines(d: str, f: dict) -> list[str]:
    if "update_error" in f:
        return [f"one update: raised on {d}: {f['update_error']} -> FAILED"]
    up = f["update_s"]
    return [f"one update: train/* mismatches {f['update_metric_mismatches'] or 'none'}; weights within "
            f"{f['update_weight_gap']:.2e} (bound {f['update_weight_bound']:.1e}); the device's weight change is "
            f"{f['update_distance']:.2e} of the CPU's (norm {f['update_norm_cpu']:.2e}) away from it -> "
            f"{'ok' if f['update_ok'] else 'FAILED'}",
            f"  step time: cpu {up['cpu']:.2f} s, {d} {up['device']:.2f} s"]


def parse(argv: list[str]) -> tuple[GpuCheckConfig, str | None]:
    """``--<field> value`` for every config field, plus ``--json PATH``."""
    parser = argparse.ArgumentParser(prog="python -m models.gpu_check", description=__doc__.splitlines()[0])
    for name, field in GpuCheckConfig.model_fields.items():
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=type(field.default),
                            default=field.default, help=field.description)
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = vars(parser.parse_args(argv))
    out = args.pop("json")
    return GpuCheckConfig(**args), out


def main(argv: list[str] | None = None) -> int:
    from transformers.utils import logging

    cfg, out = parse(sys.argv[1:] if argv is None else argv)
    logging.disable_progress_bar()
    figures, ok = gpu_check(cfg)
    print(report(cfg, figures))
    if out:
        Path(out).write_text(json.dumps(figures, indent=1, default=str))
    print("gpu_check: all checks passed" if ok else "gpu_check: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    from models.termination import install

    install()  # SIGTERM ends it as Ctrl-C does, also when swallowed in a finaliser
    sys.exit(main())

"""``models.gpu_check``: it runs on the CPU with only torch, transformers and pydantic, and its verdicts can fail.

The device side is the CPU here (``--device cpu``): the same process, the same shapes, so every figure the check
compares must agree exactly. The comparison rules are pinned on hand-made rows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models.gpu_check import Decoded, compare_decodes, compare_metrics, first_difference

ROOT = Path(__file__).resolve().parents[1]
BLOCKED = ("peft", "polars", "duckdb", "mlflow", "prefect", "docker", "matplotlib", "tasks", "flows",
           "sandbox", "sglang", "trl", "verl")
"""What an accelerator machine may lack: none of it may be imported by the check."""


def test_gpu_check_runs_on_cpu_without_the_optional_packages(tmp_path):
    out = tmp_path / "figures.json"
    code = (f"import sys, runpy\nfor name in {BLOCKED!r}:\n    sys.modules[name] = None\n"
            f"sys.argv = ['gpu_check', '--device', 'cpu', '--rows', '6', '--tokens', '24', '--json', {str(out)!r}]\n"
            "runpy.run_module('models.gpu_check', run_name='__main__')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "gpu_check: all checks passed" in proc.stdout
    assert "tokens/s: cpu" in proc.stdout and "step time: cpu" in proc.stdout
    f = json.loads(out.read_text())
    assert f["rows"] == 6 and f["greedy_equal_rows"] == 6 and f["sampled_equal_rows"] == 6
    assert f["generated"] > 6  # rows decoded more than one token each
    assert f["greedy_max_lp_diff"] == 0.0 and f["update_weight_gap"] == 0.0
    assert f["update_metric_mismatches"] == [] and f["update_metrics_cpu"]["train/tokens"] > 0
    assert f["greedy_tokens_per_s"]["device"] > 0 and f["update_s"]["device"] > 0


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # one row stopped earlier


def test_compare_decodes_tells_a_tie_from_a_bug():
    ref = [Decoded([4, 5, 6], [-0.1, -0.2, -0.3]), Decoded([7, 8], [-0.5, -0.6]), Decoded([9], [-1.0])]
    dev = [Decoded([4, 5, 9], [-0.1, -0.25, -7.0]), Decoded([7, 3], [-0.5, -0.6]), Decoded([9], [-1.0])]
    gaps = {(0, 2): 5e-4, (1, 1): 2.0}
    v = compare_decodes(ref, dev, lambda r, at: gaps[(r, at)], tie_gap=1e-3)
    assert v.equal_rows == 1
    assert v.tie_rows == [(0, 2, 5e-4)] and v.bad_rows == [(1, 1, 2.0)]
    assert v.max_lp_diff == pytest.approx(0.05)  # the common prefixes only: row 0's third log-prob is not compared
    assert not v.ok(lp_tol=1.0)  # a row parted at a clear choice fails whatever the tolerance
    tie_only = compare_decodes(ref[:1], dev[:1], lambda r, at: 5e-4, tie_gap=1e-3)
    assert tie_only.ok(lp_tol=0.06) and not tie_only.ok(lp_tol=0.04)


def test_compare_metrics():
    ref = {"train/loss": 1.0, "train/kl": 0.0, "time/old_logprobs_s": 0.1}
    assert compare_metrics(ref, {"train/loss": 1.0009, "train/kl": 5e-6, "time/old_logprobs_s": 9.0}, 1e-3, 1e-5) == []
    off = compare_metrics(ref, {"train/loss": 1.002, "train/kl": 0.0, "time/old_logprobs_s": 0.1}, 1e-3, 1e-5)
    assert off == ["train/loss: cpu 1.0 vs device 1.002"]
    assert compare_metrics(ref, {"train/loss": 1.0}, 1e-3, 1e-5) == ["train/kl: cpu 0.0 vs device None"]


def test_greedy_decoding_is_the_arg_max_of_a_plain_forward():
    from transformers import AutoModelForCausalLM

    from models.gpu_check import decode, prompts

    model = AutoModelForCausalLM.from_pretrained(ROOT / "assets/tiny-warm").eval()
    batch = prompts(str(ROOT / "assets/tiny-warm"), 3)
    rows, _ = decode(model, 2, 0, batch, 12, 0.0, seed=0)
    for prompt, row in zip(batch, rows):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + row.ids])).logits[0, len(prompt) - 1 : -1]
        logp = torch.log_softmax(logits, -1)
        assert row.ids == logp.argmax(-1).tolist()
        assert row.lps == pytest.approx(logp.max(-1).values.tolist(), abs=1e-5)


def test_an_update_that_raises_on_the_device_is_reported_and_fails(monkeypatch):
    """Reading the trainer, an update on CUDA may raise (tensors made on the CPU beside the device's): the check says
    so beside the decode's figures and fails, never a passed check without an update."""
    from models import gpu_check

    def broken(*args):
        raise RuntimeError("Expected all tensors to be on the same device")

    monkeypatch.setattr(gpu_check, "check_update", broken)
    cfg = gpu_check.GpuCheckConfig(model=str(ROOT / "assets/tiny-warm"), device="cpu", rows=2, tokens=4)
    figures, ok = gpu_check.gpu_check(cfg)
    assert not ok and figures["decode_ok"] and not figures["update_ok"]
    text = gpu_check.report(cfg, figures)
    assert "one update: raised on cpu: RuntimeError: Expected all tensors to be on the same device -> FAILED" in text


def _device_side(mutant):
    """``run_update`` whose device side (the ``dev`` folder) gets ``mutant(start, applied)`` of each weight tensor
    instead of the update it computed; the CPU side is untouched."""
    from safetensors.torch import load_file, save_file

    from models import gpu_check

    real = gpu_check.run_update

    def run(model, samples, device, lr, seed, out):
        metrics, wall = real(model, samples, device, lr, seed, out)
        if out.name == "dev":
            start, applied = load_file(str(Path(model) / "model.safetensors")), load_file(str(out / "model.safetensors"))
            save_file({k: mutant(start[k], applied[k]).contiguous() for k in applied}, str(out / "model.safetensors"))
        return metrics, wall

    return run


@pytest.mark.parametrize(("name", "mutant", "distance"), [
    ("applied", lambda w0, w: w, 0.0),
    ("skipped", lambda w0, w: w0.clone(), 1.0),
    ("negated", lambda w0, w: 2 * w0 - w, 2.0),
    ("half", lambda w0, w: (w0 + w) / 2, 0.5),
])
def test_the_weight_check_fails_an_update_the_device_did_not_apply(monkeypatch, name, mutant, distance):
    """The device's optimizer step did nothing, or stepped the wrong way, or half: its train/* figures are the CPU's
    (computed before the step), and Adam moves every weight by about lr whatever the gradient, so its new weights
    stay within 2 × lr of the CPU's; only the weight change itself tells: its distance from the CPU's, relative to
    the CPU's, is 1 (skipped), 2 (negated), 0.5 (half), and anything above ``update_rtol`` = 0.25 fails."""
    from models import gpu_check

    model = str(ROOT / "assets/tiny-warm")
    cfg = gpu_check.GpuCheckConfig(model=model, device="cpu", rows=2, tokens=6)
    batch = gpu_check.prompts(model, cfg.rows)
    ref, _ = gpu_check.decode(gpu_check.load(model, "cpu"), 2, 0, batch, cfg.tokens, 0.0, seed=0)
    monkeypatch.setattr(gpu_check, "run_update", _device_side(mutant))
    figures, ok = gpu_check.check_update(cfg, batch, ref)
    assert figures["update_distance"] == pytest.approx(distance, abs=1e-6)
    assert figures["update_norm_cpu"] > 0 and figures["update_metric_mismatches"] == []
    assert ok is (name == "applied")
    if name == "skipped":  # what the old check (the new weights' largest gap against 2 x lr x steps) let through
        assert figures["update_weight_gap"] <= figures["update_weight_bound"]

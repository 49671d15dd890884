"""An R3L step draws the same reflections in every process: its sampling seeds hold no ``hash`` of a ``str``.

Two interpreters with different ``PYTHONHASHSEED`` run the same R3L step (the committed reflecting policy
``assets/tiny-r3l`` sampling at temperature 1, the local sandbox, two synthetic prompts) and print the seed
of every engine call and the reflections drawn; both must agree token for token. A resumed or retried R3L
step thus reproduces its retries and training rows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

STEP = """
import json, torch
from transformers import AutoTokenizer
from models.chat import ChatFormat
from models.config import EngineConfig
from models.engine import make_engine
from sandbox.base import make_sandbox
from sandbox.config import SandboxConfig
from tasks.data.synthetic import make_problems
from tasks.rollout.r3l_config import R3LConfig
from tasks.r3l.driver import R3LRollout
from tasks.rollout.config import RolloutConfig, SAARConfig
from tasks.rollout.machine import Rollout
from tasks.rollout.types import PromptItem

torch.set_num_threads(1)
path = "assets/tiny-r3l"
chat = ChatFormat(AutoTokenizer.from_pretrained(path))
engine = make_engine(EngineConfig(temperature=1.0), path, chat.eos_id, chat.eos_id)
seeds, generate = [], engine.generate
engine.generate = lambda reqs, seed: seeds.append(seed) or generate(reqs, seed)
items = [PromptItem(f"p{i}", [{"role": "user", "content": p.question}], "synthetic/arith", str(p.answer),
                    {"setup": p.setup}) for i, p in enumerate(make_problems(2, 5, "eval"))]
cfg = RolloutConfig(n_samples=2, max_turns=3, max_new_tokens=96, max_response_tokens=256, scheduling="rounds",
                    saar=SAARConfig(enabled=False))
r3l = R3LConfig(reflection_prompt="compact", log_style="compact", guidance_template="compact",
                guidance_indent=None, max_reflect_tokens=48)
with make_sandbox(SandboxConfig(backend="local", workers=1)) as box:
    res = R3LRollout(Rollout(cfg, engine, chat, box), r3l, lambda t: 0.0).run(items, seed=0, step=3, progress=False)
print(json.dumps({"seeds": seeds, "reflections": [r.response_ids for r in res.reflections]}))
"""


def run_step(hash_seed: str) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", STEP], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_two_interpreters_draw_the_same_reflections():
    a, b = run_step("1"), run_step("2")
    assert len(a["reflections"]) == 2 and all(a["reflections"])
    assert a["seeds"] == b["seeds"]
    assert a["reflections"] == b["reflections"]


def test_the_reflection_seed_is_salted_like_every_other_stream():
    from tasks.r3l.driver import reflection_seed
    from tasks.rollout.machine import sampling_salt

    assert reflection_seed(0, 3) == hash((0, 3, 2_244_048_869)) % 2**31  # zlib.crc32(b"r3l-reflect")
    assert sampling_salt(0, 3, "r3l-reflect") == (0, 3, 2_244_048_869)
    assert len({reflection_seed(0, 3), reflection_seed(0, 4), reflection_seed(1, 3), reflection_seed(0, 3, 1)}) == 4

"""The ``sglang`` engine against a real SGLang server (``infra/sglang/launch_server.sh``) on a CUDA machine.

Skipped, with the reason, where CUDA or the ``[gpu]`` extra (sglang) is missing.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
from pathlib import Path

import pytest

from models.config import EngineConfig
from models.engine import GenRequest, make_engine
from models.sglang_test_server import free_port

ROOT = Path(__file__).resolve().parents[1]


def _gpu_skip_reason() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "needs CUDA (real SGLang cannot run on CPU; the CPU test double covers the contract)"
    if importlib.util.find_spec("sglang") is None:
        return "sglang not installed: pip install -e '.[gpu]' on the CUDA machine"
    return None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_gpu_skip_reason() is not None, reason=_gpu_skip_reason() or "")]


@pytest.fixture(scope="module")
def real_server(warm_model_dir, tmp_path_factory):
    port, run_dir = free_port(), tmp_path_factory.mktemp("sglang")
    env = {**os.environ, "MODEL_PATH": str(warm_model_dir), "RUN_DIR": str(run_dir)}
    subprocess.run(["bash", str(ROOT / "infra/sglang/launch_server.sh"), "-", str(port)], env=env, check=True,
                   timeout=900)
    pid = int((run_dir / f"server-{port}.pid").read_text())
    yield f"http://127.0.0.1:{port}"
    os.killpg(pid, signal.SIGTERM)


def test_real_sglang_generates_and_reloads(real_server, warm_model_dir, chat):
    eng = make_engine(EngineConfig(kind="sglang", server_urls=[real_server]), warm_model_dir, chat.eos_id, 0)
    prompt = chat.prompt_ids([{"role": "user", "content": "What is 2 + 3?"}])
    outs = eng.generate([GenRequest(prompt, 16) for _ in range(8)], seed=0)
    assert all(len(o.token_ids) == len(o.logprobs) and 1 <= len(o.token_ids) <= 17 for o in outs)
    assert all(o.finish_reason == "length" or o.token_ids[-1] == chat.eos_id for o in outs)
    eng.loaded = {u: None for u in eng.urls}
    eng.load_weights(warm_model_dir)
    eng.close()

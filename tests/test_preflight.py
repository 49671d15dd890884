"""``python -m infra.verl.preflight`` on this CPU machine: it names each problem a GPU node would not have, one
line each, exit 1 — the GPU lock's versions, the attention implementation, the GPUs, the sandbox image, Ray."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("cleaner_preflight", ROOT / "infra" / "verl" / "preflight.py")
preflight = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(preflight)


def _lines(capsys, *argv) -> tuple[int, list[str]]:
    rc = preflight.main(list(argv))
    return rc, capsys.readouterr().out.splitlines()


def test_a_cpu_machine_fails_with_one_line_per_problem(capsys):
    import torch
    import transformers

    rc, lines = _lines(capsys, "cleaner.sandbox.backend=local")
    assert rc == 1 and lines[-1] == f"preflight: {len(lines) - 1} problem(s)"
    assert f"packages: torch: locked 2.11.0, installed {torch.__version__}" in lines
    assert f"packages: transformers: locked 5.8.1, installed {transformers.__version__}" in lines
    assert "packages: sglang: locked 0.5.14, installed nothing" in lines
    assert any(x.startswith("attention: flash_attention_2 needs flash_attn, which does not import") for x in lines)
    assert "gpus: 0 CUDA devices visible, the run asks for 8 per node (trainer.n_gpus_per_node)" in lines
    assert not any(x.startswith(("sandbox:", "ray:")) for x in lines), "local sandbox, one node: nothing to say"


def test_attention_gpus_and_ray_follow_the_run_config(capsys):
    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        closed.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{closed.getsockname()[1]}"
        _, lines = _lines(capsys, "trainer.nnodes=2", "trainer.n_gpus_per_node=0", "cleaner.sandbox.backend=local",
                          "+actor_rollout_ref.model.override_config.attn_implementation=sdpa", "--address", dead)
        assert [x for x in lines if not x.startswith("packages:")][:-1] == [
            f"ray: no Ray cluster answers at {dead} ([Errno 111] Connection refused)"]
        _, lines = _lines(capsys, "trainer.nnodes=2", "--address", f"127.0.0.1:{listening.getsockname()[1]}",
                          "cleaner.sandbox.backend=local", "actor_rollout_ref.model.override_config.attn_implementation=x")
    assert not any(x.startswith("ray:") for x in lines)
    assert "attention: unknown attn_implementation 'x'; known: ['eager', 'flash_attention_2', 'flash_attention_3', 'sdpa']" in lines
    _, lines = _lines(capsys, "trainer.nnodes=3", "cleaner.sandbox.backend=local")
    assert any(x.startswith("ray: trainer.nnodes=3 but no Ray address") for x in lines)


@pytest.mark.docker
def test_a_missing_sandbox_image_is_named(capsys):
    _, lines = _lines(capsys, "cleaner.sandbox.image=cleaner-sandbox:no-such-tag")
    assert ("sandbox: the Docker engine has no image 'cleaner-sandbox:no-such-tag'; build it with `make sandbox-image` "
            "on this node") in lines
    _, lines = _lines(capsys)
    assert not any(x.startswith("sandbox:") for x in lines), "the image make sandbox-image built is there"

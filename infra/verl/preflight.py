"""Preflight of a GPU node before a verl run: ``python -m infra.verl.preflight`` from the repo root, in seconds.

What it checks (``CHECKS``, in order), each problem one line on stdout, exit 1 when there is any:

- ``packages``: every package of ``requirements-gpu.lock`` installed at its locked version (``infra/lock.py``
  ``installed_problems``: "torch: locked 2.11.0, installed 2.13.0+cpu");
- ``attention``: the attention implementation the run config names (``actor_rollout_ref.model.override_config
  .attn_implementation``, verl's default ``flash_attention_2``) imports (``ATTENTION``: its module);
- ``gpus``: at least ``trainer.n_gpus_per_node`` CUDA devices visible to torch;
- ``sandbox``: with ``cleaner.sandbox.backend: docker``, a Docker engine answers and holds the sandbox image
  (``cleaner.sandbox.image``; ``make sandbox-image`` builds it);
- ``ray``: the Ray cluster of ``--address`` (default ``$RAY_ADDRESS``) accepts a TCP connection at its GCS port; with
  ``trainer.nnodes`` > 1 an address is required (one driver joins the cluster that ``ray start --head`` and ``ray
  start --address`` on the other nodes made: docs/run_at_scale.md).

``--config`` (default ``configs/verl/cleaner_grpo.yaml``) and ``key=value`` overrides (as given to
``infra/verl/run_cleaner_grpo.sh``: ``trainer.n_gpus_per_node=8``) say what the run needs. Simplifies: the
overrides are dotted keys with YAML values, no Hydra interpolation; the Ray check is a socket, not ``ray.init``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import socket
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
ATTENTION = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface", "sdpa": "torch",
             "eager": "torch"}
"""transformers' ``attn_implementation`` → the module it needs."""


def _lock():
    spec = importlib.util.spec_from_file_location("cleaner_lock", ROOT / "infra" / "lock.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_config(path: Path, overrides: list[str]) -> dict:
    """The run config's YAML with ``key.sub=value`` overrides applied (values parsed as YAML)."""
    cfg = yaml.safe_load(path.read_text()) or {}
    for item in overrides:
        key, sep, value = item.lstrip("+").partition("=")
        if not sep:
            raise SystemExit(f"preflight: override {item!r} is not key=value")
        node = cfg
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return cfg


def _get(cfg: dict, dotted: str, default):
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def check_packages(cfg: dict, args) -> list[str]:
    lock = _lock()
    return [f"packages: {p}" for p in lock.installed_problems(ROOT / lock.GPU_LOCK, exact=False)]


def check_attention(cfg: dict, args) -> list[str]:
    impl = _get(cfg, "actor_rollout_ref.model.override_config.attn_implementation", "flash_attention_2")
    module = ATTENTION.get(impl)
    if module is None:
        return [f"attention: unknown attn_implementation {impl!r}; known: {sorted(ATTENTION)}"]
    try:
        importlib.import_module(module)
    except Exception as err:  # noqa: BLE001 — an ImportError or a CUDA library that fails to load: the finding
        return [f"attention: {impl} needs {module}, which does not import ({type(err).__name__}: {err})"]
    return []


def check_gpus(cfg: dict, args) -> list[str]:
    want = int(_get(cfg, "trainer.n_gpus_per_node", 1))
    try:
        import torch

        have = torch.cuda.device_count()
    except Exception as err:  # noqa: BLE001
        return [f"gpus: torch cannot count CUDA devices ({type(err).__name__}: {err})"]
    return [] if have >= want else [f"gpus: {have} CUDA devices visible, the run asks for {want} per node "
                                    "(trainer.n_gpus_per_node)"]


def check_sandbox(cfg: dict, args) -> list[str]:
    backend = _get(cfg, "cleaner.sandbox.backend", "docker")
    if backend != "docker":
        return []
    from sandbox.docker_backend import docker_client, image_present

    image = _get(cfg, "cleaner.sandbox.image", "cleaner-sandbox:latest")
    try:
        client = docker_client(timeout=5)
    except Exception as err:  # noqa: BLE001 — SandboxInfraError says why
        return [f"sandbox: {err}"]
    return [] if image_present(client, image) else [f"sandbox: the Docker engine has no image {image!r}; build it "
                                                     "with `make sandbox-image` on this node"]


def check_ray(cfg: dict, args) -> list[str]:
    nnodes = int(_get(cfg, "trainer.nnodes", 1))
    address = args.address or os.environ.get("RAY_ADDRESS", "")
    if not address:
        return [] if nnodes <= 1 else [f"ray: trainer.nnodes={nnodes} but no Ray address (--address or RAY_ADDRESS): "
                                       "start the cluster with `ray start --head` and `ray start --address` first"]
    if address == "auto":
        current = Path("/tmp/ray/ray_current_cluster")
        if not current.exists():
            return ["ray: RAY_ADDRESS=auto but no cluster was started on this node (`ray start --head`)"]
        address = current.read_text().strip()
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port or 6379)), timeout=3):
            return []
    except (OSError, ValueError) as err:
        return [f"ray: no Ray cluster answers at {address} ({err})"]


CHECKS = {"packages": check_packages, "attention": check_attention, "gpus": check_gpus, "sandbox": check_sandbox,
          "ray": check_ray}


def preflight(cfg: dict, args) -> list[str]:
    """Every check's problems, in ``CHECKS`` order."""
    return [line for check in CHECKS.values() for line in check(cfg, args)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infra.verl.preflight", description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="run config overrides, key=value (as for run_cleaner_grpo.sh)")
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "verl" / "cleaner_grpo.yaml")
    ap.add_argument("--address", default=None, help="the Ray cluster (host:port, auto); default $RAY_ADDRESS")
    args = ap.parse_intermixed_args(argv)
    problems = preflight(run_config(args.config, args.overrides), args)
    for line in problems:
        print(line)
    print(f"preflight: {len(problems)} problem(s)" if problems else f"preflight: ok ({', '.join(CHECKS)})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

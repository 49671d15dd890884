"""A CPU test double of an SGLang server: the same HTTP JSON contract, served by transformers.

What: ``POST /generate`` (``input_ids`` — one list or a batch — ``sampling_params`` with
``temperature``, ``top_p``, ``max_new_tokens``, ``stop_token_ids``, ``stop`` strings, ``ignore_eos``;
``return_logprob``, ``logprob_start_len``) answers ``{"text", "output_ids", "meta_info": {"id", "finish_reason",
"prompt_tokens", "completion_tokens", "output_token_logprobs": [[logprob, token_id, null], ...],
"input_token_logprobs": [[null, id, null], [logprob, id, null], ...]}}`` (input positions from
``logprob_start_len`` on, none without it, the first logprob null, raw logits) like ``sglang.launch_server``
(0.5.14, the release ``requirements-gpu.lock`` pins; ``tests/test_sglang_contract.py`` decodes these answers with
SGLang's own types and compares them with its own finish-reason classes and stop rule). Stops are SGLang's, in its
order (``Req.update_finish_state``): the token budget first (``{"type": "length", "length": max_new_tokens}``), then
a stop string (``{"type": "stop", "matched": "<the string>"}``, the ids cut after the first token whose text completes
it), then a stop id — any of ``stop_token_ids`` and **every eos id of the model** (``config.json``'s and
``generation_config.json``'s ``eos_token_id``, one id or a list, and the tokenizer's eos; ``ModelConfig
._get_hf_eos_token_id``) — ``{"type": "stop", "matched": <id>}``, the id kept; ``ignore_eos`` turns every stop id off.
``POST /update_weights_from_disk`` (``{"model_path"}`` → ``{"success", "message", "num_paused_requests"}``, 400 on
failure); ``POST /abort_request`` (``{"rid": "", "abort_all": true}`` aborts every request that arrived before it,
``{"rid": id}`` the request sent with that ``rid``): a running request stops after its next token and answers
``{"type": "abort", "message": "Aborted", "status_code": null, "err_type": null}`` with the ids and log-probs
sampled so far, a request still waiting answers ``{"type": "abort", "message": "Abort in waiting queue"}`` with
none (SGLang's two messages); ``GET /health`` and ``GET /health_generate``: **503 while the server is starting**
(it listens at once, loads the model in the background, then waits ``start_delay`` seconds: SGLang's warm-up), 200
once it serves; ``GET /get_model_info`` and ``GET /get_server_info`` (here: batch sizes formed,
``max_batch_seen``, ``recent_batches`` and ``aborted_requests``).
It exists so the ``sglang`` engine and a full RL step through HTTP are tested on machines where
SGLang cannot be installed. It is not SGLang. ``start_test_server`` / ``stop_server`` run it as
a subprocess on a free loopback port (tests, ``tasks.training.bench_engines``).

Simplifies: continuous batching is imitated by collecting the requests that arrive until the queue has
been quiet for 20 ms into one decoding batch (grouped by temperature and top_p; each request is answered
as soon as it ends, later arrivals wait for the batch to drain); a stop string is searched in the decoded text of
all the ids sampled so far (SGLang searches a tail window); no stop regexes, no streaming.

Run: ``python -m models.sglang_test_server --model-path assets/tiny-warm --port 30000 [--pid-file F]
[--step-delay S] [--start-delay S]`` (listens on 127.0.0.1 only).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from models.config import EngineConfig
from models.engine import GenRequest, TransformersEngine, token_logprobs

BATCH_QUIET_S = 0.02
"""A batch closes once no request arrived for this long (SGLang batches continuously instead)."""
BATCH_MAX_WAIT_S = 0.25
NO_TOKEN = -2
"""The decoding stream's end id: no id; every stop is this server's (``Backend.stop_hit``)."""
WAITING_ABORT = {"type": "abort", "message": "Abort in waiting queue"}
RUNNING_ABORT = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


def model_eos_ids(model_path: str | Path) -> set[int]:
    """The ids SGLang stops on for this model unless ``ignore_eos``: ``config.json``'s and ``generation_config.json``'s
    ``eos_token_id`` (one id or a list) and the tokenizer's eos id."""
    from transformers import AutoTokenizer

    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        path = Path(model_path) / name
        value = json.loads(path.read_text()).get("eos_token_id") if path.exists() else None
        ids |= {value} if isinstance(value, int) else set(value or [])
    eos = AutoTokenizer.from_pretrained(model_path).eos_token_id
    return ids | ({eos} if eos is not None else set())


class Backend:
    """The model and a batching queue: requests wait a few ms so concurrent ones share a forward."""

    def __init__(self, model_path: str, threads: int = 1, max_batch: int = 64, step_delay: float = 0.0):
        if step_delay < 0:
            raise ValueError(f"step_delay must be >= 0 seconds, got {step_delay}")
        from transformers import AutoTokenizer

        cfg = json.loads((Path(model_path) / "config.json").read_text())
        self.eos_ids = model_eos_ids(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        pad = cfg.get("pad_token_id")
        self.engine = TransformersEngine(EngineConfig(threads=threads, max_batch=max_batch), model_path,
                                         NO_TOKEN, pad if isinstance(pad, int) else min(self.eos_ids, default=0))
        self.model_path = model_path
        self.queue: asyncio.Queue = asyncio.Queue()
        self.ids = itertools.count()
        self.lock = asyncio.Lock()
        self.max_batch_seen = 0
        self.recent_batches: collections.deque = collections.deque(maxlen=64)
        self.abort_epoch = 0
        """``abort_all`` aborts every request that arrived before it: those tagged with an older epoch."""
        self.aborted_rids: set[str] = set()
        self.aborted_count = 0
        self.step_delay = step_delay
        """Seconds slept after every decoding step: a test that aborts mid-generation need not race the model
        (the tiny model decodes 600 tokens in under a second)."""

    async def generate(self, ids: list[int], params: dict, rid: str | None = None) -> dict:
        fut = asyncio.get_running_loop().create_future()
        await self.queue.put((ids, params, fut, (self.abort_epoch, rid)))
        return await fut

    def abort(self, rid: str | None, abort_all: bool) -> None:
        """SGLang's ``/abort_request``: running requests stop at the next token, queued ones before they start."""
        if abort_all:
            self.abort_epoch += 1
        elif rid:
            self.aborted_rids.add(rid)

    def _aborted(self, tag: tuple[int, str | None]) -> bool:
        epoch, rid = tag
        return epoch < self.abort_epoch or (rid is not None and rid in self.aborted_rids)

    async def worker(self) -> None:
        while True:
            batch = [await self.queue.get()]
            deadline = asyncio.get_running_loop().time() + BATCH_MAX_WAIT_S
            while asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(BATCH_QUIET_S)
                if self.queue.empty():
                    break
                while not self.queue.empty():
                    batch.append(self.queue.get_nowait())
            self.max_batch_seen = max(self.max_batch_seen, len(batch))
            self.recent_batches.append(len(batch))
            groups: dict[tuple, list] = {}
            for item in batch:
                p = item[1]
                groups.setdefault((float(p.get("temperature", 1.0)), float(p.get("top_p", 1.0))), []).append(item)
            async with self.lock:
                for key, items in groups.items():
                    await self._run_group(key, items)

    async def _run_group(self, key: tuple, items: list) -> None:
        temperature, top_p = key
        loop = asyncio.get_running_loop()

        def answer(i: int, ids: list[int], lps: list[float], finish: dict) -> None:  # from the decoding thread
            fut = items[i][2]
            loop.call_soon_threadsafe(fut.set_result, self._response(len(items[i][0]), ids, lps, finish))

        reqs = [GenRequest(ids, int(p.get("max_new_tokens", 128))) for ids, p, _, _ in items]
        try:
            await asyncio.to_thread(self._generate, reqs, [p for _, p, _, _ in items], [tag for *_, tag in items],
                                    max(temperature, 1e-5), top_p, answer)
        except Exception as err:  # noqa: BLE001 — reported to every request still waiting as a 500
            for _, _, fut, _ in items:
                if not fut.done():
                    fut.set_exception(err)

    def _generate(self, reqs: list[GenRequest], params: list[dict], tags: list, temperature: float, top_p: float,
                  answer) -> None:
        """Decode the batch continuously, answering each request when it ends: a waiting request aborted since it
        arrived leaves before it starts, a running one after its next token; after each token every running row is
        checked for a stop (``stop_hit``); the stream itself ends rows only at their budget."""
        eng = self.engine
        eng.cfg = eng.cfg.model_copy(update={"temperature": temperature, "top_p": top_p})
        stream = eng.stream(seed=next(self.ids), keep_prefix=False)
        for i, r in enumerate(reqs):
            stream.submit(i, r.input_ids, r.max_new_tokens)
        open_ = set(range(len(reqs)))
        while stream.busy:
            running = {row.key for row in stream.rows}
            self._leave(stream, {i for i in open_ - running if self._aborted(tags[i])}, WAITING_ABORT, open_, answer)
            for i, ids, lps, _ in stream.step() if stream.busy else []:
                open_.discard(i)
                answer(i, ids, lps, {"type": "length", "length": reqs[i].max_new_tokens})
            stops = {row.key: hit for row in stream.rows if (hit := self.stop_hit(row.out, params[row.key]))}
            for i, ids, lps, _ in stream.abort(set(stops)) if stops else []:
                open_.discard(i)
                n, matched = stops[i]
                answer(i, ids[:n], lps[:n], {"type": "stop", "matched": matched})
            running = {row.key for row in stream.rows}
            self._leave(stream, {i for i in open_ & running if self._aborted(tags[i])}, RUNNING_ABORT, open_, answer)
            if self.step_delay:
                time.sleep(self.step_delay)

    def _leave(self, stream, keys: set[int], finish: dict, open_: set[int], answer) -> None:
        """Rows or waiting requests ``keys`` aborted: answered with what they sampled and ``finish``."""
        for i, ids, lps, _ in stream.abort(keys) if keys else []:
            open_.discard(i)
            self.aborted_count += 1
            answer(i, ids, lps, finish)

    def stop_hit(self, out: list[int], params: dict) -> tuple[int, int | str] | None:
        """(ids kept, what matched) when ``out`` (a running row's ids) must stop, SGLang's way: a stop string
        first (the ids up to the first token whose text completes it), then the last id among ``stop_token_ids``
        and the model's eos ids, unless ``ignore_eos``."""
        stops = params.get("stop") or []
        for stop in [stops] if isinstance(stops, str) else stops:
            if stop and stop in self.tokenizer.decode(out):
                return next(k for k in range(1, len(out) + 1) if stop in self.tokenizer.decode(out[:k])), stop
        if out and not params.get("ignore_eos") and (out[-1] in self.eos_ids
                                                     or out[-1] in (params.get("stop_token_ids") or [])):
            return len(out), out[-1]
        return None

    def _response(self, n_prompt: int, ids: list[int], lps: list[float], finish: dict) -> dict:
        return {
            "text": self.tokenizer.decode(ids), "output_ids": ids,
            "meta_info": {"id": f"req-{next(self.ids)}", "finish_reason": finish, "prompt_tokens": n_prompt,
                          "completion_tokens": len(ids),
                          "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids)]},
        }

    async def input_logprobs(self, ids: list[int], start: int) -> list[list]:
        """SGLang's ``input_token_logprobs`` from ``logprob_start_len`` = ``start`` on: ``[logprob, id, null]`` per
        input position, the first logprob ``null`` (SGLang shifts the prefill's log-probs by one), raw logits
        (temperature 1)."""
        if start >= len(ids):
            return []
        async with self.lock:
            lps = await asyncio.to_thread(token_logprobs, self.engine.model, ids, start + 1) if start + 1 < len(ids) \
                else []
        return [[None, ids[start], None]] + [[lp, t, None] for lp, t in zip(lps, ids[start + 1 :])]

    async def update_weights(self, path: str) -> tuple[bool, str]:
        async with self.lock:
            try:
                await asyncio.to_thread(self.engine.load_weights, path)
            except Exception as err:  # noqa: BLE001 — the contract answers success=false
                return False, f"Failed to update weights from {path}: {type(err).__name__}: {err}"
            self.model_path = path
            return True, "Succeeded to update model weights."


def _start_error(start: int, n: int) -> dict:
    """SGLang's answer (HTTP 400) to a ``logprob_start_len`` past the input: the scheduler aborts it as a bad request
    (``Scheduler.handle_generate_request``), the tokenizer manager raises its message, ``/generate`` answers it."""
    return {"error": {"message": f"req.logprob_start_len={start} is higher than the number of input tokens "
                                 f"len(req.origin_input_ids)={n}. Please use a smaller logprob_start_len."}}


def build_app(load, start_delay: float = 0.0):
    """The server's routes; ``load()`` builds the ``Backend`` in a thread once the server listens, and
    ``start_delay`` seconds later it serves: until then ``/health`` answers 503 and other calls wait."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    state: dict = {}
    ready = asyncio.Event()

    async def serving() -> Backend:
        await ready.wait()
        return state["backend"]

    async def generate(request: Request):
        body = await request.json()
        ids, params = body.get("input_ids"), body.get("sampling_params") or {}
        if not isinstance(ids, list) or not ids:
            return JSONResponse({"error": {"message": "input_ids: a list of token ids is required"}}, 400)
        backend = await serving()
        batch = isinstance(ids[0], list)
        rid = body.get("rid")
        rids = rid if batch and isinstance(rid, list) else [rid] * (len(ids) if batch else 1)
        start = body.get("logprob_start_len")
        start = -1 if start is None else int(start)
        rows = ids if batch else [ids]
        if body.get("return_logprob") and any(start > len(x) for x in rows):
            return JSONResponse(_start_error(start, min(len(x) for x in rows)), 400)
        outs = await asyncio.gather(*[backend.generate(x, params, r) for x, r in zip(rows, rids)])
        if body.get("return_logprob"):
            for x, out in zip(rows, outs):
                out["meta_info"]["input_token_logprobs"] = await backend.input_logprobs(x, len(x) if start < 0 else start)
        return JSONResponse(list(outs) if batch else outs[0])

    async def abort_request(request: Request):
        body = await request.json()
        (await serving()).abort(body.get("rid") or None, bool(body.get("abort_all")))
        return Response(status_code=200)

    async def update(request: Request):
        path = (await request.json()).get("model_path")
        backend = await serving()
        ok, msg = await backend.update_weights(path) if path else (False, "model_path is required")
        return JSONResponse({"success": ok, "message": msg, "num_paused_requests": 0}, 200 if ok else 400)

    async def health(request: Request):
        return Response(status_code=200 if ready.is_set() else 503)

    async def info(request: Request):
        backend = await serving()
        return JSONResponse({"model_path": backend.model_path, "tokenizer_path": backend.model_path,
                             "is_generation": True})

    async def start() -> None:
        try:
            backend = await asyncio.to_thread(load)
        except Exception as err:  # noqa: BLE001 — a server that cannot load its model exits, as SGLang does
            print(f"sglang_test_server: cannot load the model: {type(err).__name__}: {err}", file=sys.stderr)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        await asyncio.sleep(start_delay)
        state["backend"], state["worker"] = backend, asyncio.get_running_loop().create_task(backend.worker())
        ready.set()

    @contextlib.asynccontextmanager
    async def lifespan(app):
        task = asyncio.get_running_loop().create_task(start())
        yield
        for t in (task, state.get("worker")):
            if t is not None:
                t.cancel()

    async def server_info(request: Request):
        backend = await serving()
        return JSONResponse({"model_path": backend.model_path, "max_batch_seen": backend.max_batch_seen,
                             "recent_batches": list(backend.recent_batches), "aborted_requests": backend.aborted_count,
                             "test_double": True})

    routes = [Route("/get_server_info", server_info), Route("/generate", generate, methods=["POST"]),
              Route("/update_weights_from_disk", update, methods=["POST"]),
              Route("/abort_request", abort_request, methods=["POST"]),
              Route("/health", health), Route("/health_generate", health), Route("/get_model_info", info)]
    return Starlette(routes=routes, lifespan=lifespan)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_test_server(model_path: str | Path, threads: int = 1, timeout_s: float = 300.0,
                      log_path: str | Path | None = None, step_delay: float = 0.0, start_delay: float = 0.0,
                      wait: bool = True) -> tuple[subprocess.Popen, str]:
    """Start this server in its own process group on a free 127.0.0.1 port; wait for ``/health`` (unless not
    ``wait``). ``step_delay``: seconds slept after each decoding step (``Backend.step_delay``); ``start_delay``:
    seconds it stays starting (``/health`` 503) after the model loaded."""
    from models.sglang_engine import wait_healthy

    port = free_port()
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    cmd = [sys.executable, "-m", "models.sglang_test_server", "--model-path", str(model_path),
           "--port", str(port), "--threads", str(threads), "--step-delay", str(step_delay),
           "--start-delay", str(start_delay)]
    proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[1], stdout=log, stderr=log,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        if wait:
            wait_healthy(url, timeout_s)
    except Exception:
        stop_server(proc)
        raise
    return proc, url


def stop_server(proc: subprocess.Popen) -> None:
    """Stop a server started by ``start_test_server`` (its process group, by id)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="CPU test double of an SGLang server (same /generate contract).")
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pid-file")
    ap.add_argument("--step-delay", type=float, default=0.0, help="seconds slept after each decoding step")
    ap.add_argument("--start-delay", type=float, default=0.0,
                    help="seconds /health answers 503 after the model loaded (SGLang's warm-up)")
    args = ap.parse_args(argv)
    import uvicorn

    if args.pid_file:
        Path(args.pid_file).write_text(str(os.getpid()))
    if args.step_delay < 0 or args.start_delay < 0:
        raise SystemExit(f"--step-delay and --start-delay must be >= 0, got {args.step_delay}, {args.start_delay}")
    app = build_app(lambda: Backend(args.model_path, args.threads, step_delay=args.step_delay), args.start_delay)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()

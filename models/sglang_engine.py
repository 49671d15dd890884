"""SGLang HTTP engine: the ``Engine`` contract served by ``python -m sglang.launch_server``.

What: ``@register_engine("sglang")`` — every ``GenRequest`` becomes one native ``POST /generate``
with ``input_ids``, ``sampling_params`` (temperature, top_p, max_new_tokens, stop_token_ids = the
end-of-turn id, optional stop strings) and ``return_logprob``; the new ids and their log-probs are
read together from ``meta_info.output_token_logprobs`` (``[logprob, token_id, text]`` triples), so
they always line up. ``load_weights(path)`` is ``POST /update_weights_from_disk`` on every server (a LoRA
adapter checkpoint is merged with its base first: the server reloads full weights);
construction waits for ``GET /health`` with a timeout and names the URL that never came up.

Simplifies: no ``sglang`` import and no batching of our own — requests of a step are sent
concurrently (a bounded thread pool over one keep-alive ``httpx.Client``) and the server's
continuous batching does the rest. ``stream()`` gives the rollout's continuous scheduler the same
interface as the in-process engine (each turn is sent as soon as its trajectory is ready);
its ``abort()`` is ``POST /abort_request {"rid": "", "abort_all": true}`` on every server and
returns each request's partial turn (partial rollouts). Several URLs are used round-robin per request; an SGLang
router URL works as a single server. Infrastructure failures (connection errors, 5xx, an
``abort`` finish) are retried ``max_retries`` times on the next server, then raise
``EngineError`` naming the URL: they never become an empty generation.

``score(prompt_ids, response_ids)`` (SAAR's importance decision) is one more native ``/generate`` with
``logprob_start_len``, reading ``meta_info.input_token_logprobs`` (its first entry is ``None``, see ``score``).

Run: ``engine.kind=sglang engine.server_urls=[http://127.0.0.1:30000]`` in a run config, with a
server from ``infra/sglang/launch_server.sh`` (GPU) or ``python -m models.sglang_test_server``
(CPU test double, same JSON contract).
"""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

import httpx

from models.config import EngineConfig
from models.engine import GenOutput, GenRequest, register_engine


class EngineError(RuntimeError):
    """An inference server failed (unreachable, 5xx, rejected a request); the message names the URL."""


class _Retryable(Exception):
    def __init__(self, url: str, detail: str):
        super().__init__(f"{url}: {detail}")
        self.url = url


def wait_healthy(url: str, timeout_s: float, client: httpx.Client | None = None) -> None:
    """Poll ``GET {url}/health`` until it answers 200; ``EngineError`` naming the URL after ``timeout_s``."""
    own = client is None
    client = client or httpx.Client(timeout=5.0)
    deadline, last = time.monotonic() + timeout_s, "no answer"
    try:
        while True:
            try:
                r = client.get(f"{url}/health", timeout=5.0)
                if r.status_code == 200:
                    return
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as err:
                last = f"{type(err).__name__}: {err}"
            if time.monotonic() > deadline:
                raise EngineError(f"SGLang server {url} not healthy after {timeout_s:.0f}s ({last}); "
                                  "is it running (infra/sglang/launch_server.sh) and is engine.server_urls right?")
            time.sleep(0.2)
    finally:
        if own:
            client.close()


def servable_path(path: str | Path) -> str:
    """The folder a server loads for checkpoint ``path``: itself, or for a LoRA adapter (``models.lora``) base +
    adapter merged into ``<checkpoint>-merged`` beside it (made once), since ``/update_weights_from_disk``
    takes full weights. SGLang can also serve the adapter itself (docs/run_at_scale.md); this client does not."""
    from models.lora import is_adapter, merge_adapter

    if not is_adapter(path):
        return str(path)
    merged = Path(path).with_name(Path(path).name + "-merged")
    if not (merged / "config.json").exists():
        merge_adapter(path, merged)
    return str(merged)


@register_engine("sglang")
class SGLangEngine:
    """HTTP client of one or more SGLang servers (see module docstring)."""

    def __init__(self, cfg: EngineConfig, model_path: str | Path, eos_id: int, pad_id: int):
        if not cfg.server_urls:
            raise ValueError("engine.server_urls: the sglang engine needs at least one server URL")
        self.cfg = cfg
        self.eos_id = eos_id
        self.urls = [u.rstrip("/") for u in cfg.server_urls]
        limits = httpx.Limits(max_connections=cfg.max_concurrency, max_keepalive_connections=cfg.max_concurrency)
        self.client = httpx.Client(timeout=cfg.request_timeout_s, limits=limits)
        self.pool = ThreadPoolExecutor(cfg.max_concurrency, thread_name_prefix="sglang")
        self._next = itertools.count()
        self._lock = threading.Lock()
        for url in self.urls:
            wait_healthy(url, cfg.health_timeout_s, self.client)
        self.loaded: dict[str, str | None] = {url: self._served_path(url) for url in self.urls}
        self.model_path = str(model_path)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()

    def _served_path(self, url: str) -> str | None:
        """The model path the server reports (``/get_model_info``), None when it does not say."""
        try:
            r = self.client.get(f"{url}/get_model_info")
            return r.json().get("model_path") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def load_weights(self, path: str | Path) -> None:
        """Weight sync: every server reloads its weights from ``path`` (skipped where already served); a LoRA
        adapter checkpoint is served as merged weights (``servable_path``)."""
        path = servable_path(path)
        for url in self.urls:
            if self.loaded.get(url) == path:
                continue
            try:
                r = self.client.post(f"{url}/update_weights_from_disk", json={"model_path": path})
            except httpx.HTTPError as err:
                raise EngineError(f"SGLang server {url}/update_weights_from_disk: {type(err).__name__}: {err}") from err
            body = _json(r)
            if r.status_code != 200 or not body.get("success", False):
                raise EngineError(f"SGLang server {url}/update_weights_from_disk rejected {path}: "
                                  f"HTTP {r.status_code} {body.get('message', r.text[:300])}")
            self.loaded[url] = path
        self.model_path = path

    def generate(self, requests: list[GenRequest], seed: int) -> list[GenOutput]:
        """All requests concurrently (bounded by ``max_concurrency``); results in request order."""
        return list(self.pool.map(self._generate_one, requests))

    def score(self, prompt_ids: list[int], response_ids: list[int]) -> list[float]:
        """Log-prob of each response id given everything before it: a native ``/generate`` of ``prompt + response``
        with ``return_logprob`` and ``logprob_start_len = len(prompt) - 1``, one greedy token (SGLang samples at
        least one; greedy draws nothing). SGLang answers ``meta_info.input_token_logprobs`` =
        ``[logprob, token_id, text]`` for every input position from ``logprob_start_len`` on, the first ``None``
        (``SchedulerLogprobResultProcessor._process_input_token_logprobs`` shifts the prefill's log-probs by one):
        the last prompt id's entry is that ``None``, the response's follow. These are log-probs of the raw logits
        (temperature 1) while sampled ones are temperature-scaled, so a temperature other than 1 is refused."""
        if self.cfg.temperature != 1.0:
            raise EngineError(f"sglang score: engine.temperature={self.cfg.temperature} but SGLang's prefill "
                              "log-probs are at temperature 1; the importance decision needs both at the same one")
        body, errors, first = self.score_payload(prompt_ids, response_ids), [], self._first_url()
        for attempt in range(self.cfg.max_retries + 1):
            url = self.urls[(first + attempt) % len(self.urls)]
            try:
                return _input_logprobs(self._post_generate(url, body), response_ids, url)
            except _Retryable as err:
                errors.append(str(err))
                time.sleep(min(0.25 * 2**attempt, 4.0))
        raise EngineError(f"SGLang /generate (score) failed {len(errors)} times; last: {errors[-1]}")

    @staticmethod
    def score_payload(prompt_ids: list[int], response_ids: list[int]) -> dict:
        """The ``/generate`` body of ``score``."""
        if not prompt_ids or not response_ids:
            raise ValueError("sglang score: prompt_ids and response_ids must both be non-empty")
        return {"input_ids": list(prompt_ids) + list(response_ids), "return_logprob": True,
                "logprob_start_len": len(prompt_ids) - 1, "sampling_params": {"temperature": 0.0, "max_new_tokens": 1}}

    def stream(self, seed: int = 0, keep_prefix: bool = True) -> SGLangStream:
        """Continuous scheduling over HTTP (``SGLangStream``); the servers sample and cache prefixes themselves."""
        return SGLangStream(self)

    def abort_all(self) -> None:
        """``POST /abort_request {"rid": "", "abort_all": true}`` on every server (what APRIL's ``abort`` sends)."""
        for url in self.urls:
            try:
                r = self.client.post(f"{url}/abort_request", json={"rid": "", "abort_all": True})
            except httpx.HTTPError as err:
                raise EngineError(f"SGLang server {url}/abort_request: {type(err).__name__}: {err}") from err
            if r.status_code != 200:
                raise EngineError(f"SGLang server {url}/abort_request rejected: HTTP {r.status_code} {r.text[:300]}")

    def payload(self, req: GenRequest) -> dict:
        params = {
            "temperature": self.cfg.temperature, "top_p": self.cfg.top_p, "max_new_tokens": req.max_new_tokens,
            "stop_token_ids": [self.eos_id], "skip_special_tokens": False, "no_stop_trim": True,
        }
        if self.cfg.stop:
            params["stop"] = list(self.cfg.stop)
        return {"input_ids": list(req.input_ids), "sampling_params": params, "return_logprob": True}

    def _first_url(self) -> int:
        with self._lock:
            return next(self._next)

    def _generate_one(self, req: GenRequest, aborting: threading.Event | None = None) -> GenOutput:
        """One request; an infrastructure failure is retried on the next server (round-robin). Once ``aborting``
        is set (a stream's ``abort``), an aborted answer is the partial turn and nothing is sent again."""
        body, errors, first = self.payload(req), [], self._first_url()
        for attempt in range(self.cfg.max_retries + 1):
            if aborting is not None and aborting.is_set():
                return GenOutput([], [], "abort")
            url = self.urls[(first + attempt) % len(self.urls)]
            try:
                return self._parse(self._post_generate(url, body), req, url, aborting)
            except _Retryable as err:
                errors.append(str(err))
                time.sleep(min(0.25 * 2**attempt, 4.0))
        raise EngineError(f"SGLang /generate failed {len(errors)} times; last: {errors[-1]}")

    def _post_generate(self, url: str, body: dict) -> dict:
        try:
            r = self.client.post(f"{url}/generate", json=body)
        except httpx.TransportError as err:
            raise _Retryable(url, f"{type(err).__name__}: {err}") from err
        if r.status_code >= 500:
            raise _Retryable(url, f"HTTP {r.status_code} {r.text[:300]}")
        if r.status_code != 200:
            raise EngineError(f"SGLang server {url}/generate rejected the request: HTTP {r.status_code} {r.text[:300]}")
        data = _json(r)
        return data[0] if isinstance(data, list) else data

    def _parse(self, data: dict, req: GenRequest, url: str, aborting: threading.Event | None = None) -> GenOutput:
        meta = data.get("meta_info") or {}
        finish = meta.get("finish_reason") or {}
        kind = finish.get("type") if isinstance(finish, dict) else finish
        if kind == "abort" and aborting is not None and aborting.is_set():
            triples = (meta.get("output_token_logprobs") or [])[: req.max_new_tokens]
            return GenOutput([int(t[1]) for t in triples], [float(t[0] or 0.0) for t in triples], "abort")
        if kind == "abort" or "output_token_logprobs" not in meta:
            raise _Retryable(url, f"generation aborted or without log-probs (finish_reason={finish!r})")
        triples = meta["output_token_logprobs"][: req.max_new_tokens]
        ids = [int(t[1]) for t in triples]
        lps = [float(t[0]) if t[0] is not None else 0.0 for t in triples]
        if kind == "stop":  # ids as sampled: a stop on another eos id or a stop string gets no invented end id
            return GenOutput(ids, lps, "stop")
        return GenOutput(ids, lps, "length")


class SGLangStream:
    """The rollout's continuous scheduling over HTTP: each submitted turn is one ``/generate`` in flight; ``step``
    returns those that finished (waiting at most ``poll_s`` for one, so tool results are not held up); ``abort``
    asks every server to abort everything and returns what each request had sampled (``finish_reason`` abort;
    a request the servers finished first comes back finished)."""

    def __init__(self, engine: SGLangEngine, poll_s: float = 0.05):
        self.engine, self.poll_s = engine, poll_s
        self.futures: dict[Future, object] = {}
        self.aborting = threading.Event()

    @property
    def busy(self) -> bool:
        return bool(self.futures)

    def submit(self, key: object, input_ids: list[int], max_new_tokens: int) -> None:
        req = GenRequest(list(input_ids), max(1, max_new_tokens))
        self.futures[self.engine.pool.submit(self.engine._generate_one, req, self.aborting)] = key

    def release(self, key: object) -> None:
        """Nothing to forget: the servers manage their prefix caches."""

    def step(self) -> list[tuple[object, list[int], list[float], str]]:
        done, _ = wait(self.futures, timeout=self.poll_s, return_when=FIRST_COMPLETED)
        return [self._result(f) for f in done]

    def abort(self, keys: set | None = None) -> list[tuple[object, list[int], list[float], str]]:
        if keys is not None and set(keys) != set(self.futures.values()):
            raise ValueError("SGLangStream.abort: only all requests at once (the servers' abort_all)")
        self.aborting.set()
        self.engine.abort_all()
        return [self._result(f) for f in list(wait(self.futures).done)]

    def _result(self, fut: Future) -> tuple[object, list[int], list[float], str]:
        key = self.futures.pop(fut)
        out = fut.result()
        return key, out.token_ids, out.logprobs, out.finish_reason


def _input_logprobs(data: dict, response_ids: list[int], url: str) -> list[float]:
    """The response ids' log-probs from a score answer (see ``SGLangEngine.score``); a shape that is not SGLang's
    is an ``EngineError`` naming the server, never a made-up value."""
    meta = data.get("meta_info") or {}
    finish = meta.get("finish_reason") or {}
    if isinstance(finish, dict) and finish.get("type") == "abort":
        raise _Retryable(url, f"score aborted ({finish.get('message')!r})")
    entries = meta.get("input_token_logprobs")
    if not isinstance(entries, list) or len(entries) != len(response_ids) + 1 or entries[0][0] is not None:
        raise EngineError(f"SGLang server {url}/generate: input_token_logprobs for {len(response_ids)} response ids "
                          f"should be {len(response_ids) + 1} entries, the first None; got {str(entries)[:200]}")
    ids = [int(e[1]) for e in entries[1:]]
    if ids != list(response_ids) or any(e[0] is None for e in entries[1:]):
        raise EngineError(f"SGLang server {url}/generate: input_token_logprobs do not score the response ids "
                          f"(ids {ids[:8]}..., expected {list(response_ids)[:8]}...)")
    return [float(e[0]) for e in entries[1:]]


def _json(r: httpx.Response):
    try:
        return r.json()
    except ValueError:
        return {"message": r.text[:300]}

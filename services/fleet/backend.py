"""The rollout fleet (`vllm-server`): token-in/token-out generation on `vllm serve` processes over HTTP,
and weight updates pushed to them through vLLM's weight-transfer API (`fleet/transfer.py`).

Requests go to `/v1/completions` with the prompt as token ids and come back with the generated ids
(`return_token_ids`) and each one's log-probability (the servers run with processed log-probs, i.e. of
the tempered distribution). They are spread over the live servers, fewest in flight first, and each
completion carries the version its server reports (`/weight_info`, read before each batch), so a server
restarted behind the learner's back counts as behind instead of under the newest label. A version names
its run (`run@7`): a long-lived server still holding another run's weights is taken out until this
run's update lands on it, instead of passing for a policy ahead of the learner. A request
that fails on a server (refused or reset connection, 5xx) is sent again while the server still answers
/health, `REQUEST_RETRIES` times at most: a keep-alive connection the server closes as a request goes
out fails so ("Server disconnected without sending a response"). A server that does not answer, or
fails past the retries, is marked down and its requests re-run on another; with none left, `generate`
raises `FleetError`. A request a server refuses for its own reason (4xx) fails alone. Idle connections
are dropped after `KEEPALIVE_S`, before the servers' own keep-alive (uvicorn's 5 s in vLLM) closes them.
Weight updates: `push.py`; one server's HTTP routes and version labels: `client.py`.
"""
from __future__ import annotations

import itertools
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from coevolve.services.agent.config import BackendConfig, SamplingConfig
from coevolve.services.agent.generation import BackendStats, Completion, Request, no_room
from coevolve.services.agent.precision import resolve_dtype
from coevolve.services.agent.templates import ChatTemplate
from coevolve.services.fleet.client import (FOREIGN, HINT, KEEPALIVE_S, REQUEST_RETRIES, FleetError, Server, ServerDown,
                                            parse_version)
from coevolve.services.fleet.config import FleetConfig
from coevolve.services.fleet.push import WeightPushes

class FleetBackend(WeightPushes):
    """One or more `vllm serve` processes of one model, driven as one backend."""

    name = "vllm-server"
    transfer_chunk_bytes = 256 * 1024 * 1024
    """Bytes per broadcast (one flat buffer per dtype and chunk); applies to engines opened afterwards."""

    def __init__(self, urls: list[str], model_dir: str, config: BackendConfig, fleet: FleetConfig,
                 model_name: str | None = None, *, run_id: str):
        import httpx
        from transformers import AutoTokenizer

        if not urls:
            raise FleetError("the fleet has no server URLs")
        self.run_id = run_id
        self.config = config
        self.fleet = fleet
        self.model = model_name or config.model
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.template = ChatTemplate(self.tokenizer)
        self.max_model_len = config.max_model_len
        self.dtype = resolve_dtype(config.dtype)
        self.per_server = fleet.requests_per_server
        self.http = httpx.Client(timeout=fleet.server_timeout_s,
                                 limits=httpx.Limits(max_connections=self.per_server * len(urls) + 2 * len(urls),
                                                     keepalive_expiry=KEEPALIVE_S))
        self.servers = [Server(url.rstrip("/"), i) for i, url in enumerate(urls)]
        for server in self.servers:
            server.version = self._check(server)
        self.served_model = self._served_model(self.servers[0])
        self.version = max(s.version for s in self.servers)
        self.stats = BackendStats(extra={"servers": float(len(self.servers)), "servers_down": 0.0,
                                         "servers_behind": 0.0})
        self.pool = ThreadPoolExecutor(max_workers=self.per_server * len(self.servers), thread_name_prefix="fleet")
        self._cond = threading.Condition()
        self._generating = 0
        self._updating = False
        self._turn = itertools.count()

    def _check(self, server: Server) -> int:
        """The server's version; FleetError when it does not answer /health and /weight_info."""
        self._get(server, "health")
        return self._version(server)

    def _get(self, server: Server, path: str) -> Any:
        """A 200 answer of the server's `/path`; FleetError otherwise."""
        try:
            response = self.http.get(f"{server.url}/{path}", timeout=10)
        except Exception as exc:
            raise FleetError(f"vLLM server {server.url} does not answer /{path} ({type(exc).__name__}: {exc}); "
                             f"is it running?") from exc
        if response.status_code != 200:
            raise FleetError(f"vLLM server {server.url} answers /{path} with HTTP {response.status_code}; {HINT}")
        return response

    def _answers(self, server: Server) -> bool:
        try:
            self._get(server, "health")
        except FleetError:
            return False
        return True

    def _version(self, server: Server) -> int:
        """The version the server reports holding (`/weight_info`); FleetError when it does not answer."""
        return parse_version(self._get(server, "weight_info").json().get("weight_version"), self.run_id)

    def _confirm_versions(self) -> None:
        """Each live server's version as it reports it (`/weight_info`), not as last pushed: a server restarted
        behind the learner's back serves its starting weights, and its completions must say so (it is behind,
        and the next update replaces its weights). One that does not answer is left to the requests."""
        for server in self.servers:
            if not server.up:
                continue
            try:
                reported = self._version(server)
            except FleetError:
                continue
            if reported != server.version:
                server.version, server.engine = reported, None  # a new process: its transfer group is gone too
            if reported == FOREIGN:  # its completions would pass for this run's policy
                self._mark_down(server, f"it holds another run's weights; it serves again once an update of run "
                                f"{self.run_id} lands on it")

    def _served_model(self, server: Server) -> str:
        try:
            return self.http.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["id"]
        except Exception:
            return self.model

    @property
    def server_versions(self) -> dict[str, int]:
        return {s.url: s.version for s in self.servers}

    @property
    def live_servers(self) -> list[str]:
        return [s.url for s in self.servers if s.up]

    @contextmanager
    def _generation(self) -> Iterator[None]:
        """Shared with other generations, exclusive of an update (which goes first once it waits)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._updating)
            self._generating += 1
        try:
            yield
        finally:
            with self._cond:
                self._generating -= 1
                self._cond.notify_all()

    @contextmanager
    def _update(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._updating)
            self._updating = True
            self._cond.wait_for(lambda: self._generating == 0)
        try:
            yield
        finally:
            with self._cond:
                self._updating = False
                self._cond.notify_all()

    def generate(self, requests: Sequence[Request], sampling: SamplingConfig) -> list[Completion]:
        """Send every request concurrently across the live servers; keep their order."""
        started = time.monotonic()
        with self._generation():
            self._confirm_versions()
            futures = [self.pool.submit(self._one, r, sampling) for r in requests]
            results = [f.result() for f in futures]
        lost = [r for r in results if isinstance(r, FleetError)]
        if lost:
            raise lost[0]
        self.stats.count(results, time.monotonic() - started)
        return results

    def _payload(self, request: Request, sampling: SamplingConfig, ids: list[int]) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.served_model, "prompt": ids,
            "max_tokens": request.budget(sampling, len(ids), self.max_model_len),
            "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": 0, "min_p": 0.0,
            "repetition_penalty": 1.0, "logprobs": 0, "return_token_ids": True,
            "stop_token_ids": self.template.stop_token_ids()}
        if sampling.stop:
            payload["stop"] = list(sampling.stop)
        if request.json_schema is not None:
            payload["structured_outputs"] = {"json": request.json_schema}
        return payload

    def _one(self, request: Request, sampling: SamplingConfig) -> Completion | FleetError:
        ids = request.ids(self.template)
        refused = no_room(len(ids), self.max_model_len, self.version)
        if refused is not None:
            return refused
        payload = self._payload(request, sampling, ids)
        retries = 0
        while True:
            server = self._acquire()
            if server is None:
                return FleetError(f"every vLLM server of the fleet is down ({self._down_reasons()})")
            try:
                return self._post(server, payload, len(ids))
            except ServerDown as exc:
                if retries < REQUEST_RETRIES and self._answers(server):
                    retries += 1
                    continue
                self._mark_down(server, str(exc))
            finally:
                self._release(server)

    def _acquire(self) -> Server | None:
        """The live server with the fewest requests in flight (waits while all are at their bound)."""
        with self._cond:
            while True:
                live = [s for s in self.servers if s.up]
                if not live:
                    return None
                turn = next(self._turn)
                free = [s for s in live if s.in_flight < self.per_server]
                if free:
                    server = min(free, key=lambda s: (s.in_flight, (s.index - turn) % len(self.servers)))
                    server.in_flight += 1
                    return server
                self._cond.wait()

    def _release(self, server: Server) -> None:
        with self._cond:
            server.in_flight -= 1
            self._cond.notify_all()

    def _mark_down(self, server: Server, reason: str) -> None:
        with self._cond:
            if server.up:
                server.up = False
                server.error = reason
                server.engine = None
            self.stats.extra["servers_down"] = float(sum(not s.up for s in self.servers))
            self._cond.notify_all()

    def _down_reasons(self) -> str:
        return "; ".join(f"{s.url}: {s.error}" for s in self.servers if not s.up)

    def _post(self, server: Server, payload: dict[str, Any], prompt_len: int) -> Completion:
        import httpx

        try:
            response = self.http.post(f"{server.url}/v1/completions", json=payload)
        except httpx.TimeoutException as exc:
            return Completion.failed(f"{server.url}: timed out ({exc})", server.version)
        except httpx.TransportError as exc:
            raise ServerDown(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500:
            raise ServerDown(f"HTTP {response.status_code}: {response.text[:200]}")
        if response.status_code >= 400:
            return Completion.failed(f"{server.url}: HTTP {response.status_code}: {response.text[:500]}",
                                     server.version)
        choice = response.json()["choices"][0]
        token_ids = tuple(int(t) for t in choice.get("token_ids") or ())
        logprobs = tuple(_logprob(v) for v in (choice.get("logprobs") or {}).get("token_logprobs") or ())
        server.served += 1
        return Completion(text=choice.get("text") or "", token_ids=token_ids, logprobs=logprobs,
                          finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
                          policy_version=server.version, prompt_tokens=prompt_len)

    def close(self) -> None:
        for server in self.servers:
            if server.engine is None:
                continue
            try:
                server.engine.client.shutdown_weight_transfer_engine()
            except Exception:
                pass  # the server may be gone already
            server.engine.shutdown()
            server.engine = None
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.http.close()


def _logprob(value: Any) -> float:
    if value is None:
        return float("nan")
    value = float(value)
    return value if math.isfinite(value) else float("-inf")

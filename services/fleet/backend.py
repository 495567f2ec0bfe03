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

An update waits for the requests in flight, holds new ones, and per server pauses it, broadcasts the
weights over a transfer group of its own (`weight_transfer`: this package's gloo engine on CPU, vLLM's
nccl engine on GPUs; opened on first use, re-opened after a failure), finishes the update with the new
version, resets its prefix cache and resumes it, whatever the round's outcome (a server that cannot be
resumed would hold its requests, so it is marked down). A server whose gloo transfer fails keeps its old
weights and version, and its completions say so; it is retried at the next update. One whose nccl
transfer fails may hold layers of two versions (vLLM loads each as it arrives): it is marked down, and
the next update, which revives it, replaces every layer. One that dies inside a round fails it at once
(its transfer call breaks; gloo alone would wait out its timeout) and is marked down, whichever of the
two notices first: after any failed round the server's /health is asked.
"""
from __future__ import annotations

import itertools
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

from coevolve.services.agent.config import BackendConfig, SamplingConfig
from coevolve.services.agent.generation import BackendStats, Completion, Push, Request, no_room
from coevolve.services.agent.precision import resolve_dtype
from coevolve.services.agent.templates import ChatTemplate
from coevolve.services.fleet.config import FleetConfig
from coevolve.services.runtime.ports import free_port

# The transfer engines whose server keeps its old weights whole when a transfer breaks half-way: this
# package's gloo engine loads only at the round's end. vLLM's nccl engine loads each layer as it arrives,
# so a server it leaves half-way is taken out (marked down) until an update lands in full.
OLD_WEIGHTS_KEPT = ("gloo",)
REQUEST_RETRIES = 2  # times a request is sent again to a server that failed it but answers /health
RESENDABLE = ("pause", "resume", "reset_prefix_cache")  # weight-sync routes that may safely run twice
KEEPALIVE_S = 2.0  # an idle connection is not reused after this (vLLM's servers close theirs at 5 s)
_HINT = ("start it with VLLM_SERVER_DEV_MODE=1 and --weight-transfer-config '{\"backend\": \"gloo\"}' "
         "(fleet.servers.LocalServers does)")


class FleetError(RuntimeError):
    """The fleet cannot serve: a server is unusable at start, or every server is down."""


class WeightTransferError(RuntimeError):
    """No server took a weight update; the policy version did not advance."""


class _ServerDown(Exception):
    """One server failed at the transport level (or answered 5xx)."""


@dataclass
class _Server:
    url: str
    index: int
    version: int = 0
    up: bool = True
    in_flight: int = 0
    served: int = 0
    engine: Any = None
    error: str = ""


class _SyncClient:
    """vLLM's weight-sync routes of one server (`VLLMWeightSyncClient`), with the server's error text."""

    def __init__(self, http: Any, url: str):
        self.http = http
        self.url = url

    def post(self, path: str, json: Any = None, params: dict | None = None) -> Any:
        """POST a route; one that may run twice (`RESENDABLE`) is sent again, `REQUEST_RETRIES` times at most,
        when the server closed the keep-alive connection under it. A route that failed with an exception
        answers 500 and then has uvicorn close the connection, so the next call often meets exactly that."""
        import httpx

        for attempt in itertools.count():
            try:
                response = self.http.post(f"{self.url}/{path}", json=json, params=params)
                break
            except httpx.RemoteProtocolError:
                if path not in RESENDABLE or attempt >= REQUEST_RETRIES:
                    raise
        if response.status_code >= 400:
            raise RuntimeError(f"{self.url}/{path}: HTTP {response.status_code}: {response.text[:500]}")
        return response.json() if response.content else None

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.post("init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self) -> None:
        try:
            self.post("start_weight_update")
        except RuntimeError as exc:  # a round left open by a failed learner: close it (nothing is pending)
            if "already active" not in str(exc):
                raise
            self.post("finish_weight_update")
            self.post("start_weight_update")

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.post("update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.post("finish_weight_update", {"weight_version": weight_version} if weight_version is not None else None)

    def shutdown_weight_transfer_engine(self) -> None:
        self.post("shutdown_weight_transfer_engine")


FOREIGN = -1
"""The version of a server whose weights are another run's (a long-lived server the last run updated)."""


def version_label(run_id: str, version: int) -> str:
    """The weight version a server is given: the run's id and its policy version (`run@7`)."""
    return f"{run_id}@{version}"


def _parse_version(value: Any, run_id: str) -> int:
    """The policy version of this run that a server's `weight_version` names: 0 for vLLM's "default" (the
    weights it started with), FOREIGN for a version of another run or an unlabelled one."""
    if value is None or value == "default":
        return 0
    run, _, number = str(value).rpartition("@")
    return int(number) if run == run_id and number.isdigit() else FOREIGN


class FleetBackend:
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
        self.servers = [_Server(url.rstrip("/"), i) for i, url in enumerate(urls)]
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

    def _check(self, server: _Server) -> int:
        """The server's version; FleetError when it does not answer /health and /weight_info."""
        self._get(server, "health")
        return self._version(server)

    def _get(self, server: _Server, path: str) -> Any:
        """A 200 answer of the server's `/path`; FleetError otherwise."""
        try:
            response = self.http.get(f"{server.url}/{path}", timeout=10)
        except Exception as exc:
            raise FleetError(f"vLLM server {server.url} does not answer /{path} ({type(exc).__name__}: {exc}); "
                             f"is it running?") from exc
        if response.status_code != 200:
            raise FleetError(f"vLLM server {server.url} answers /{path} with HTTP {response.status_code}; {_HINT}")
        return response

    def _answers(self, server: _Server) -> bool:
        try:
            self._get(server, "health")
        except FleetError:
            return False
        return True

    def _version(self, server: _Server) -> int:
        """The version the server reports holding (`/weight_info`); FleetError when it does not answer."""
        return _parse_version(self._get(server, "weight_info").json().get("weight_version"), self.run_id)

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

    def _served_model(self, server: _Server) -> str:
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
            except _ServerDown as exc:
                if retries < REQUEST_RETRIES and self._answers(server):
                    retries += 1
                    continue
                self._mark_down(server, str(exc))
            finally:
                self._release(server)

    def _acquire(self) -> _Server | None:
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

    def _release(self, server: _Server) -> None:
        with self._cond:
            server.in_flight -= 1
            self._cond.notify_all()

    def _mark_down(self, server: _Server, reason: str) -> None:
        with self._cond:
            if server.up:
                server.up = False
                server.error = reason
                server.engine = None
            self.stats.extra["servers_down"] = float(sum(not s.up for s in self.servers))
            self._cond.notify_all()

    def _down_reasons(self) -> str:
        return "; ".join(f"{s.url}: {s.error}" for s in self.servers if not s.up)

    def _post(self, server: _Server, payload: dict[str, Any], prompt_len: int) -> Completion:
        import httpx

        try:
            response = self.http.post(f"{server.url}/v1/completions", json=payload)
        except httpx.TimeoutException as exc:
            return Completion.failed(f"{server.url}: timed out ({exc})", server.version)
        except httpx.TransportError as exc:
            raise _ServerDown(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500:
            raise _ServerDown(f"HTTP {response.status_code}: {response.text[:200]}")
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

    def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int | None = None) -> Push:
        """Push (name, tensor) pairs, named as in the Hugging Face checkpoint, to every live server."""
        import httpx
        import torch

        from coevolve.services.fleet.transfer import NamedTensorSource, register

        register()
        new_version = self.version + 1 if version is None else int(version)
        started = time.monotonic()
        with self._update():
            try:
                source = NamedTensorSource(named_tensors, getattr(torch, self.dtype))
                source.metadata()  # the first pass over the weights; each server's round is another
            except Exception as exc:
                raise WeightTransferError(f"no server took version {new_version}: the weights could not be "
                                          f"read ({type(exc).__name__}: {exc})") from exc
            self._revive()
            errors = []
            for server in self.servers:
                if not server.up:
                    continue
                try:
                    self._push(server, source, new_version)
                except Exception as exc:
                    errors.append(f"{server.url}: {type(exc).__name__}: {exc}")
                    if isinstance(exc, httpx.TransportError):
                        self._mark_down(server, f"{type(exc).__name__}: {exc}")
                    elif not self._answers(server):  # gloo may notice the dead peer before its transfer call does
                        self._mark_down(server, f"it stopped answering in the transfer of version {new_version} "
                                        f"({type(exc).__name__}: {exc})")
                    elif self.fleet.weight_transfer not in OLD_WEIGHTS_KEPT:  # its layers may be of two versions
                        self._mark_down(server, f"a transfer of version {new_version} broke half-way on "
                                        f"{self.fleet.weight_transfer} ({type(exc).__name__}: {exc}); it serves "
                                        "again after a complete update")
            taken = sum(s.up and s.version == new_version for s in self.servers)
            self.stats.extra["servers_behind"] = float(sum(s.up and s.version != new_version for s in self.servers))
            if not taken:
                raise WeightTransferError(f"no server took version {new_version}: " + ("; ".join(errors) or
                                          f"every server is down ({self._down_reasons()})"))
            self.version = new_version
        seconds = time.monotonic() - started
        self.stats.extra["last_update_seconds"] = seconds
        return Push(new_version, source.nbytes, seconds, taken, int(self.stats.extra["servers_behind"]))

    def _push(self, server: _Server, source: Any, version: int) -> None:
        client = _SyncClient(self.http, server.url)
        client.post("pause", params={"mode": "wait"})
        try:
            if server.engine is None:
                server.engine = self._engine(server, client, source)
            if self.fleet.weight_transfer == "gloo":
                server.engine.send_weights(version_label(self.run_id, version), source=source)
            else:  # vLLM's own engine replays the source it holds; the version is set apart
                server.engine.source = source
                server.engine.send_weights()
                client.post("update_weight_version", {"new_version": version_label(self.run_id, version)})
            client.post("reset_prefix_cache")
            server.version = version
        except Exception:
            if server.engine is not None:
                server.engine.shutdown()
            server.engine = None
            raise
        finally:
            self._resume(server, client)

    def _resume(self, server: _Server, client: _SyncClient) -> None:
        """Resume a server after its round, whatever the round's outcome. One that cannot be resumed would
        hold every request sent to it until `server_timeout_s`, so it is taken out until an update revives
        it (that update's round resumes it)."""
        try:
            client.post("resume")
        except Exception as exc:
            what = "could not be resumed after" if self._answers(server) else "stopped answering in"
            self._mark_down(server, f"it {what} a weight transfer ({type(exc).__name__}: {exc})")

    def _engine(self, server: _Server, client: _SyncClient, source: Any) -> Any:
        """The learner's end of one server's transfer group: this package's gloo engine, or vLLM's nccl one
        (GPUs; the learner's rank 0 and the server's workers rendezvous at transfer_host:port)."""
        port = self.fleet.transfer_port + server.index if self.fleet.transfer_port else free_port()
        if self.fleet.weight_transfer == "nccl":
            from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            info = NCCLTrainerInitInfo(master_address=self.fleet.transfer_host, master_port=port, world_size=2,
                                       rank=0)
            return WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)
        from coevolve.services.fleet.transfer import GlooTrainerInitInfo, GlooTrainerWeightTransferEngine

        info = GlooTrainerInitInfo(master_address=self.fleet.transfer_host, master_port=port, rank=0,
                                   timeout_s=self.fleet.server_timeout_s, chunk_bytes=self.transfer_chunk_bytes)
        return GlooTrainerWeightTransferEngine.trainer_init(info, client=client)

    def _revive(self) -> None:
        """Take back a down server that answers again (a restarted pod); it gets the next update in full."""
        for server in self.servers:
            if server.up:
                continue
            try:
                server.version = self._check(server)
            except FleetError:
                continue
            server.up, server.error, server.engine = True, "", None
        self.stats.extra["servers_down"] = float(sum(not s.up for s in self.servers))

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

"""One vLLM server of the rollout fleet as the learner sees it: its state (`Server`), its weight-sync
routes (`ServerClient`, with `REQUEST_RETRIES` for a connection closed under a route that may run
twice) and the version labels that name their run (`run@7`)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

REQUEST_RETRIES = 2  # times a request is sent again to a server that failed it but answers /health
RESENDABLE = ("pause", "resume", "reset_prefix_cache")  # weight-sync routes that may safely run twice
KEEPALIVE_S = 2.0  # an idle connection is not reused after this (vLLM's servers close theirs at 5 s)
HINT = ("start it with VLLM_SERVER_DEV_MODE=1 and --weight-transfer-config '{\"backend\": \"gloo\"}' "
        "(fleet.servers.LocalServers does)")


class FleetError(RuntimeError):
    """The fleet cannot serve: a server is unusable at start, or every server is down."""


class WeightTransferError(RuntimeError):
    """No server took a weight update; the policy version did not advance."""


class ServerDown(Exception):
    """One server failed at the transport level (or answered 5xx)."""


@dataclass
class Server:
    url: str
    index: int
    version: int = 0
    up: bool = True
    in_flight: int = 0
    served: int = 0
    engine: Any = None
    error: str = ""


class ServerClient:
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


def parse_version(value: Any, run_id: str) -> int:
    """The policy version of this run that a server's `weight_version` names: 0 for vLLM's "default" (the
    weights it started with), FOREIGN for a version of another run or an unlabelled one."""
    if value is None or value == "default":
        return 0
    run, _, number = str(value).rpartition("@")
    return int(number) if run == run_id and number.isdigit() else FOREIGN

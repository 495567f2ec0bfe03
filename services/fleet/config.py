"""Settings of the rollout fleet (`learner.backend = vllm-server`): which servers, and how weights reach them."""
from __future__ import annotations

from dataclasses import dataclass

from coevolve.services.runtime.config import ConfigError, doc

TRANSFER_ENGINES = ("gloo", "nccl")


@dataclass(frozen=True)
class FleetConfig:
    """The vLLM servers a `vllm-server` learner rolls out on, and the weight transfer that updates them."""

    servers: int = doc(1, "vllm-server: local `vllm serve` processes the learner starts when server_urls is empty.")
    server_urls: str = doc("", "vllm-server: comma-separated base URLs of running servers (e.g. a Kubernetes "
                           "Deployment's pods); empty starts `servers` local ones.")
    weight_transfer: str = doc("gloo", "vllm-server: weight-transfer engine, gloo (CPU, TCP; registered by this "
                               "package's vLLM plugin) or nccl (GPUs).")
    transfer_host: str = doc("127.0.0.1", "vllm-server: the address at which the servers reach the learner's "
                             "transfer rendezvous.")
    transfer_port: int = doc(0, "vllm-server: first port of the transfer rendezvous (one per server); 0 picks "
                             "free ports.")
    requests_per_server: int = doc(16, "vllm-server: generation requests in flight per server at most (the server "
                                   "batches them).")
    server_start_timeout_s: float = doc(300.0, "vllm-server: seconds a local server may take to answer /health.")
    server_timeout_s: float = doc(300.0, "vllm-server: seconds one generation or transfer request to a server may "
                                  "take.")

    def __post_init__(self) -> None:
        if self.servers < 1 or self.requests_per_server < 1:
            raise ConfigError(f"servers ({self.servers}) and requests_per_server ({self.requests_per_server}) must "
                              "be at least 1")
        if self.weight_transfer not in TRANSFER_ENGINES:
            raise ConfigError(f"weight_transfer={self.weight_transfer!r}: choose {', '.join(TRANSFER_ENGINES)}")
        if not 0 <= self.transfer_port < 65536:
            raise ConfigError(f"transfer_port={self.transfer_port} is not a port (0 picks free ones)")
        if self.server_start_timeout_s <= 0 or self.server_timeout_s <= 0:
            raise ConfigError("server_start_timeout_s and server_timeout_s must be positive")

    @property
    def urls(self) -> list[str]:
        return [u.strip().rstrip("/") for u in self.server_urls.split(",") if u.strip()]

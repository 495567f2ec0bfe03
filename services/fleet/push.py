"""Weight updates of the rollout fleet, a part of `FleetBackend` (`backend.py`).

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

import time
from typing import Any, Iterable

from coevolve.services.agent.generation import Push
from coevolve.services.fleet.client import FleetError, Server, ServerClient, WeightTransferError, version_label
from coevolve.services.runtime.ports import free_port

# The transfer engines whose server keeps its old weights whole when a transfer breaks half-way: this
# package's gloo engine loads only at the round's end. vLLM's nccl engine loads each layer as it arrives,
# so a server it leaves half-way is taken out (marked down) until an update lands in full.
OLD_WEIGHTS_KEPT = ("gloo",)


class WeightPushes:
    """`FleetBackend`'s weight updates: every method here runs on the backend (its servers, HTTP
    client, fleet settings and update turn)."""

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

    def _push(self, server: Server, source: Any, version: int) -> None:
        client = ServerClient(self.http, server.url)
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

    def _resume(self, server: Server, client: ServerClient) -> None:
        """Resume a server after its round, whatever the round's outcome. One that cannot be resumed would
        hold every request sent to it until `server_timeout_s`, so it is taken out until an update revives
        it (that update's round resumes it)."""
        try:
            client.post("resume")
        except Exception as exc:
            what = "could not be resumed after" if self._answers(server) else "stopped answering in"
            self._mark_down(server, f"it {what} a weight transfer ({type(exc).__name__}: {exc})")

    def _engine(self, server: Server, client: ServerClient, source: Any) -> Any:
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

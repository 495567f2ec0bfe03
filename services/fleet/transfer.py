"""The `gloo` weight-transfer engine: vLLM's RL weight-transfer API over TCP, for CPU servers.

vLLM 0.32's dense engine (`nccl`) needs GPUs. This one has the same shape: the learner is rank 0 of a
two-rank gloo process group built on a `TCPStore` it hosts (no global `torch.distributed` state on
either side), and broadcasts the weights to the server's worker, packed into one flat buffer per
dtype and chunk. The worker keeps every received tensor until the round's `finish_weight_update`, and
only then loads them (vLLM's layerwise reload, the path that works on CPU), so a transfer that breaks
half-way leaves the server on its old weights. After loading, an LM head tied to the embeddings gets
its oneDNN packing redone (`vllm_quirks.repack_tied_head`).

`register` is this package's `vllm.general_plugins` entry point: vLLM runs it in every process it
starts, so a server launched with `--weight-transfer-config '{"backend": "gloo"}'` finds the engine.
"""
from __future__ import annotations

import datetime
import gc
import threading
import traceback
from concurrent.futures import FIRST_COMPLETED, FIRST_EXCEPTION, Future, wait
from contextlib import closing
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Generator, Iterable, Iterator, Self

import torch

from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from coevolve.services.runtime.stores import gloo_options, hosted_store

BACKEND = "gloo"
DEFAULT_CHUNK_BYTES = 256 * 1024 * 1024
_PREFIX = "coevolve-gloo/"


def plan_chunks(dtype_names: list[str], shapes: list[list[int]], chunk_bytes: int) -> list[list[int]]:
    """Indices of the tensors sent together: consecutive ones of one dtype, up to `chunk_bytes` a chunk."""
    chunks: list[list[int]] = []
    current: list[int] = []
    size, dtype = 0, None
    for i, (name, shape) in enumerate(zip(dtype_names, shapes)):
        nbytes = _numel(shape) * getattr(torch, name).itemsize
        if current and (name != dtype or size + nbytes > chunk_bytes):
            chunks.append(current)
            current, size = [], 0
        current.append(i)
        size += nbytes
        dtype = name
    if current:
        chunks.append(current)
    return chunks


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _group(address: str, port: int, rank: int, world_size: int, timeout_s: float,
           is_master: bool) -> tuple[Any, Any]:
    """A gloo process group of its own, over a TCPStore at (address, port)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = hosted_store(address, port, world_size, timeout, wait_for_workers=False) if is_master else \
        torch.distributed.TCPStore(address, port, world_size, is_master=False, timeout=timeout, wait_for_workers=False)
    group = torch.distributed.ProcessGroupGloo(torch.distributed.PrefixStore(_PREFIX, store), rank,
                                               world_size, gloo_options(address, is_master, timeout))
    return store, group


def _background(fn: Any, *args: Any) -> Future:
    """Run `fn` in a daemon thread (one left blocked by a broken peer does not hold up the exit). A failure's
    traceback keeps its frames, and the frames their locals and functions, for as long as the failure lives;
    a group held that way would never be destroyed, leaving the server blocked in its round. So the
    arguments are the thread's, not the closure's, and are dropped before the failure is handed over:
    this frame may still be running when the caller clears the traceback's frames."""
    future: Future = Future()

    def run(*arguments: Any) -> None:
        try:
            future.set_result(fn(*arguments))
        except BaseException as exc:
            del arguments
            future.set_exception(exc)

    threading.Thread(target=run, args=args, name="gloo-transfer", daemon=True).start()
    return future


def _broadcast(group: Any, tensor: torch.Tensor) -> None:
    options = torch.distributed.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([tensor], options).wait()


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    """What a server's worker needs to join the learner's group (it is rank `rank` + its own rank)."""

    master_address: str
    master_port: int
    rank: int = 1
    world_size: int = 2
    timeout_s: float = 300.0
    chunk_bytes: int = DEFAULT_CHUNK_BYTES


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    """One round's tensors, in the order they are broadcast (JSON-safe)."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError("names, dtype_names and shapes must have the same length")

    @classmethod
    def of(cls, meta: list[ParamMeta]) -> "GlooUpdateInfo":
        """The round that sends a source with this metadata."""
        return cls(names=[m.name for m in meta], dtype_names=[str(m.dtype).removeprefix("torch.") for m in meta],
                   shapes=[list(m.shape) for m in meta])


class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    """Server side: receives broadcast weights and loads them at the end of the round."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self._store: Any = None
        self._group: Any = None
        self._chunk_bytes = DEFAULT_CHUNK_BYTES
        self._pending: list[tuple[str, torch.Tensor]] = []

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        """Join the learner's group (replacing any earlier one); blocks until the learner is there too."""
        self.shutdown()
        rank = init_info.rank + self.parallel_config.rank
        self._store, self._group = _group(init_info.master_address, init_info.master_port, rank,
                                          init_info.world_size, init_info.timeout_s, is_master=False)
        self._chunk_bytes = init_info.chunk_bytes

    def start_weight_update(self) -> None:
        self._pending = []

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """Receive one round (no accelerator to synchronize on CPU)."""
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self._group is None:
            raise RuntimeError("gloo weight transfer is not initialized: call init_weight_transfer_engine first")
        for chunk in plan_chunks(update_info.dtype_names, update_info.shapes, self._chunk_bytes):
            dtype = getattr(torch, update_info.dtype_names[chunk[0]])
            sizes = [_numel(update_info.shapes[i]) for i in chunk]
            flat = torch.empty(sum(sizes), dtype=dtype, device="cpu")
            _broadcast(self._group, flat)
            for i, part in zip(chunk, flat.split(sizes)):
                self._pending.append((update_info.names[i], part.view(update_info.shapes[i]).to(self.device)))

    def finish_weight_update(self) -> None:
        """Load the received weights into the model (nothing when no round completed)."""
        if not self._pending:
            return
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        from coevolve.services.agent.vllm_quirks import repack_tied_head

        weights, self._pending = self._pending, []
        initialize_layerwise_reload(self.model)
        try:
            self.model.load_weights(iter(weights))
        finally:
            finalize_layerwise_reload(self.model, self.model_config)
        repack_tied_head(self.model)

    def shutdown(self) -> None:
        self._pending = []
        self._group = None
        self._store = None


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    """The learner's side of the rendezvous: it hosts the TCPStore at (master_address, master_port)."""

    backend: ClassVar[str] = BACKEND

    master_address: str
    master_port: int
    world_size: int = 2
    timeout_s: float = 300.0
    chunk_bytes: int = DEFAULT_CHUNK_BYTES


class NamedTensorSource(WeightSource):
    """A `WeightSource` over (name, tensor) pairs, cast to the server's dtype as they are sent.

    Weights that can be read again (a list, or the learner's `PolicyWeights`, whose every pass gathers
    the policy anew one tensor at a time) are streamed: the metadata takes one pass that keeps only
    names and shapes, and each server's round another, so no more than one tensor and the chunk being
    sent are held at once. A one-shot iterator is read into a list, since each server needs its own pass.
    """

    def __init__(self, named_tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None):
        self.weights = list(named_tensors) if isinstance(named_tensors, Iterator) else named_tensors
        self.dtype = dtype
        self._meta: list[ParamMeta] | None = None

    def metadata(self) -> list[ParamMeta]:
        if self._meta is None:
            self._meta = [ParamMeta(name, self.dtype or t.dtype, tuple(t.shape)) for name, t in self]
        return self._meta

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        pairs = iter(self.weights)
        try:
            for name, tensor in pairs:
                tensor = tensor.detach()
                yield name, tensor.to(self.dtype) if self.dtype is not None else tensor
        finally:
            if isinstance(pairs, Generator):  # a pass left early ends its gathers (every rank takes part)
                pairs.close()

    @property
    def nbytes(self) -> int:
        """Bytes on the wire for one server."""
        return sum(m.dtype.itemsize * _numel(m.shape) for m in self.metadata())


def broadcast_round(group: Any, source: WeightSource, info: GlooUpdateInfo, chunk_bytes: int,
                    received: Future | None = None) -> None:
    """Broadcast one round's chunks over `group`, the source read one tensor at a time; stop when the
    server's side of the round (`received`) has ended early."""
    with closing(iter(source)) as pairs:
        for chunk in plan_chunks(info.dtype_names, info.shapes, chunk_bytes):
            if received is not None and received.done():
                received.result()  # the server refused the round: do not wait in a broadcast for it
                raise RuntimeError("the server finished receiving before the broadcast did")
            tensor = _packed(pairs, info, chunk)
            if received is None:
                _broadcast(group, tensor)
                continue
            sent = _background(_broadcast, group, tensor)
            wait([sent, received], return_when=FIRST_COMPLETED)
            if not sent.done() and received.exception() is not None:
                # The server left the round (its process died): gloo would wait out its timeout for a peer
                # that is gone, so the blocked broadcast is left to end in its own thread.
                received.result()
            sent.result()


def _packed(pairs: Iterator[tuple[str, torch.Tensor]], info: GlooUpdateInfo, chunk: list[int]) -> torch.Tensor:
    """The chunk's tensors, taken from `pairs` one at a time into one flat buffer."""
    flat: torch.Tensor | None = None
    offset = 0
    for i in chunk:
        name, tensor = next(pairs)
        if name != info.names[i] or list(tensor.shape) != info.shapes[i]:
            raise RuntimeError(f"weight source yielded {name} {list(tensor.shape)}, expected "
                               f"{info.names[i]} {info.shapes[i]}")
        if len(chunk) == 1:
            return tensor.reshape(-1).contiguous()
        if flat is None:
            size = sum(_numel(info.shapes[j]) for j in chunk)
            flat = torch.empty(size, dtype=tensor.dtype, device=tensor.device)
        flat[offset:offset + tensor.numel()].copy_(tensor.reshape(-1))
        offset += tensor.numel()
    return flat


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """Learner side: hosts the group with one server and broadcasts each round to it."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client: Any, source: WeightSource | None = None, is_sender: bool = True,
                 info: GlooTrainerInitInfo | None = None) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.info = info
        self._store: Any = None
        self._group: Any = None

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client: Any,
                     source: WeightSource | None = None) -> Self:
        engine = cls(client=client, source=source, is_sender=init_info.is_sender, info=init_info)
        if not engine.is_sender:
            return engine
        worker = GlooInitInfo(master_address=init_info.master_address, master_port=init_info.master_port,
                              rank=1, world_size=init_info.world_size, timeout_s=init_info.timeout_s,
                              chunk_bytes=init_info.chunk_bytes)
        timeout = datetime.timedelta(seconds=init_info.timeout_s)
        # Bind the store first (a busy port fails here), then let the server join while the group forms.
        store = hosted_store(init_info.master_address, init_info.master_port, init_info.world_size, timeout,
                             wait_for_workers=False)
        try:
            joined = _background(client.init_weight_transfer_engine, asdict(worker))
            formed = _background(torch.distributed.ProcessGroupGloo, torch.distributed.PrefixStore(_PREFIX, store),
                                 0, init_info.world_size, gloo_options(init_info.master_address, True, timeout))
            done, _ = wait([joined, formed], timeout=init_info.timeout_s, return_when=FIRST_EXCEPTION)
            for future in done:
                future.result()
            if len(done) < 2:
                raise TimeoutError(f"the server did not join the gloo group within {init_info.timeout_s:.0f} s")
            engine._store, engine._group = store, formed.result()
        except BaseException:
            del store
            raise
        return engine

    def send_weights(self, weight_version: str | None = None, source: WeightSource | None = None) -> None:
        """One round: start, broadcast while the server receives, finish with `weight_version`.

        On any failure the group is destroyed, so a server blocked in a broadcast fails at once (gloo
        closes its connections only then: `abort` and `shutdown` leave the peer waiting for its timeout),
        and the server's `update_weights` call is awaited, so it is out of the round when it is resumed;
        the engine must then be initialized again.
        """
        source = source or self.source
        if source is None:
            raise ValueError("send_weights needs a WeightSource")
        meta = source.metadata()
        if not self.is_sender:
            for _ in source:
                pass
            return
        if self._group is None:
            raise RuntimeError("the gloo group is gone; initialize the engine again (trainer_init)")
        info = GlooUpdateInfo.of(meta)
        received: Future | None = None
        try:
            self.client.start_weight_update()
            received = _background(self.client.update_weights, asdict(info))
            broadcast_round(self._group, source, info, self.info.chunk_bytes if self.info else DEFAULT_CHUNK_BYTES,
                            received)
            received.result()
        except BaseException as exc:
            self.shutdown()
            # A gloo group closes its connections only when destroyed: drop the traceback's references too.
            traceback.clear_frames(exc.__traceback__)
            gc.collect()
            if received is not None:  # let the server leave the broken round before anyone resumes it
                wait([received], timeout=self.info.timeout_s if self.info else None)
            raise
        self.client.finish_weight_update(weight_version)

    def shutdown(self) -> None:
        """Drop the group and the store (the server's side of a broken group errors out at once)."""
        self._group = None
        self._store = None


def register() -> None:
    """The vLLM plugin: register both sides of the `gloo` engine (again is harmless)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    for factory, name in ((WeightTransferEngineFactory, "GlooWeightTransferEngine"),
                          (WeightTransferTrainerFactory, "GlooTrainerWeightTransferEngine")):
        try:
            factory.register_engine(BACKEND, __name__, name)
        except ValueError:  # already registered in this process
            pass

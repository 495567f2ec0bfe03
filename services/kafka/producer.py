"""A producer of Avro events that never drops a message silently.

Sends with acks=all and retries. `flush()` waits for every delivery confirmation; when the broker stays
unreachable past the delivery timeout it raises DeliveryError, naming the bootstrap address and the
exact event ids that were not delivered.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from kafka import KafkaProducer
from kafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError

from coevolve.schemas import SchemaRegistry, default_registry
from coevolve.services.kafka.security import KafkaSecurity
from coevolve.services.kafka.topics import CATALOG, check_write
from coevolve.services.runtime.log import get_logger

log = get_logger("producer")


class DeliveryError(RuntimeError):
    """Some events were not confirmed by the broker."""

    def __init__(self, bootstrap: str, undelivered: list[str], cause: str):
        self.bootstrap = bootstrap
        self.undelivered = undelivered
        shown = ", ".join(undelivered[:10]) + (" ..." if len(undelivered) > 10 else "")
        super().__init__(f"{len(undelivered)} event(s) not delivered to the broker at {bootstrap} "
                         f"({cause}); check that the broker runs and KAFKA_BOOTSTRAP points to it. "
                         f"Undelivered: {shown}")


@dataclass
class _Pending:
    event_id: str
    future: object


DELIVERY_TIMEOUT_S = 30.0  # how long a send may go unconfirmed (reconnects and retries included)


class EventProducer:
    """Encode events with the schema registry and send them, tracking every delivery. A producer made for a
    `service` sends only to the topics of its row of `topics.WRITES` (operator tools and tests name none)."""

    def __init__(self, bootstrap: str, client_id: str = "coevolve", delivery_timeout_s: float = DELIVERY_TIMEOUT_S,
                 registry: SchemaRegistry | None = None, linger_ms: int = 5,
                 security: KafkaSecurity | None = None, service: str | None = None):
        self.bootstrap, self.service = bootstrap, service
        self.registry = registry or default_registry()
        self.delivery_timeout_s = delivery_timeout_s
        timeout_ms = int(delivery_timeout_s * 1000)
        try:
            self._producer = KafkaProducer(
                bootstrap_servers=bootstrap, client_id=client_id, acks="all", retries=2**31 - 1,
                retry_backoff_ms=100, reconnect_backoff_ms=100, reconnect_backoff_max_ms=2000,
                delivery_timeout_ms=timeout_ms, request_timeout_ms=min(timeout_ms // 2, 10000),
                max_block_ms=timeout_ms, bootstrap_timeout_ms=timeout_ms, linger_ms=linger_ms,
                batch_size=256 * 1024,
                max_in_flight_requests_per_connection=1,
                **(security or KafkaSecurity.from_environment()).kafka_python_options(),
            )
        except (KafkaConnectionError, KafkaTimeoutError) as exc:
            raise DeliveryError(bootstrap, [], f"cannot connect: {exc}") from exc
        self._pending: list[_Pending] = []
        self.sent = 0

    def send(self, topic: str, event: dict, key: str | None = None, record_name: str | None = None) -> None:
        """Queue one event; its record name defaults to the topic's event in the catalog."""
        name = record_name or CATALOG[topic].event
        payload = self.registry.encode(name, event)
        self.send_raw(topic, payload, key, event.get("event_id", "?"))

    def send_raw(self, topic: str, payload: bytes, key: str | bytes | None, event_id: str) -> None:
        """Queue already-encoded bytes (dead letters, replays)."""
        if self.service is not None:
            check_write(self.service, topic)
        key_bytes = key.encode() if isinstance(key, str) else key
        try:
            future = self._producer.send(topic, value=payload, key=key_bytes)
        except KafkaError as exc:
            undelivered = [event_id]
            try:
                self.flush()  # settle what was queued before, so the error lists exactly what failed
            except DeliveryError as err:
                undelivered = err.undelivered + undelivered
            raise DeliveryError(self.bootstrap, undelivered, f"send failed: {exc}") from exc
        self._pending.append(_Pending(event_id, future))
        if len(self._pending) >= 50_000:
            self.flush()

    def flush(self, timeout_s: float | None = None) -> int:
        """Wait for every queued event's confirmation; return how many were confirmed."""
        timeout_s = self.delivery_timeout_s if timeout_s is None else timeout_s
        pending, self._pending = self._pending, []
        deadline = time.monotonic() + timeout_s
        try:
            self._producer.flush(timeout=timeout_s)
        except KafkaError:
            pass  # the per-future check below says which events failed
        undelivered, cause = [], ""
        for item in pending:
            try:
                item.future.get(timeout=max(0.0, deadline - time.monotonic()))
            except Exception as exc:  # KafkaTimeoutError, broker errors: each means not delivered
                undelivered.append(item.event_id)
                cause = cause or repr(exc)
        confirmed = len(pending) - len(undelivered)
        self.sent += confirmed
        if undelivered:
            log.error("producer.undelivered", bootstrap=self.bootstrap, count=len(undelivered))
            raise DeliveryError(self.bootstrap, undelivered, cause)
        return confirmed

    def close(self) -> None:
        """Flush, then close the client."""
        try:
            self.flush()
        finally:
            self._producer.close(timeout=1)

    def __enter__(self) -> "EventProducer":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:
            self._producer.close(timeout=1)

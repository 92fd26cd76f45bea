"""Audit records to a Kafka topic, besides the JSON-lines file, without ever slowing client traffic.

The producing is librdkafka's (confluent-kafka): `produce()` copies the record into librdkafka's
queue and returns; batching, compression, retries and the network run on librdkafka's own C
threads, so the proxy's event loop pays one C call per record. The queue is bounded
(`queue.buffering.max.messages` = `audit.queue_max_records`): when the audit cluster is slow or
down and the queue is full, `produce()` raises BufferError at once and the record is dropped and
counted, never waited for. Delivery reports are served by a small thread of ours (`poll`), so
neither they nor the queue-depth gauge cost the loop anything.

The producer is idempotent with acks=all (no duplicates or reordering from its retries) and talks
straight to the brokers (`audit.bootstrap`, default the proxy's upstream), never through the
proxy's own listeners: its requests are not the proxy's clients, so they are neither verified
nor audited.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Protocol

from prometheus_client import Counter, Gauge

from txnguard.proxy import logs
from txnguard.proxy.config import ConfigError, HostPort, ProxyConfig

PUBLISHED, DROPPED, FAILED = "published", "dropped", "failed"
LOG_INTERVAL_S = 10.0  # at most one line per interval per kind of trouble, with the count since the last
POLL_S = 0.1


class AuditMetrics(Protocol):
    """What the publisher counts (ProxyMetrics has both)."""

    audit_records: Counter      # by outcome
    audit_queue_depth: Gauge


class RecordLog(Protocol):
    """The audit log the publisher is attached to (guard.AuditLog)."""

    proxy_id: str

    def attach(self, sink: AuditPublisher) -> None: ...


def proxy_id(config: ProxyConfig, listen_port: int) -> str:
    """The name this proxy signs its records with; the bound port, so an ephemeral listener names itself."""
    return config.audit.proxy_id or f"{config.mode}@{config.advertised}:{listen_port}"


def bootstrap_of(config: ProxyConfig) -> tuple[HostPort, ...]:
    bootstrap = config.audit.bootstrap or config.upstream
    if config.listen.port != 0 and config.listen in bootstrap:
        # Through our own listener, the producer's requests would become a client of this proxy.
        raise ConfigError(f"audit.bootstrap: {config.listen} is this proxy's own listener; name the brokers")
    return bootstrap


def producer_config(config: ProxyConfig) -> dict[str, Any]:
    a = config.audit
    conf: dict[str, Any] = {
        "bootstrap.servers": ",".join(str(h) for h in bootstrap_of(config)),
        "client.id": "txnguard-audit",
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": a.linger_ms,
        "queue.buffering.max.messages": a.queue_max_records,
        "message.timeout.ms": a.delivery_timeout_ms,
        "compression.type": "lz4",  # JSON records of one proxy repeat most of their keys and values
    }
    t = config.upstream_tls
    if t is not None:  # the brokers want TLS from the proxy: the audit producer uses the same files
        conf["security.protocol"] = "SSL"
        conf.update({k: v for k, v in (("ssl.ca.location", t.cafile), ("ssl.certificate.location", t.certfile),
                                        ("ssl.key.location", t.keyfile)) if v})
        conf["ssl.endpoint.identification.algorithm"] = "https" if t.check_hostname else "none"
    conf.update(a.producer)
    return conf


class _Throttled:
    """Counts occurrences; logs the first at once, then at most one line per interval with the count."""

    def __init__(self, log: Any, event: str, level: str = "warning", count_as: str = "records",
                 interval_s: float = LOG_INTERVAL_S) -> None:
        self.log, self.event, self.level, self.count_as, self.interval_s = log, event, level, count_as, interval_s
        self._lock = threading.Lock()  # hit from the loop (drops) and from the poll thread (failures)
        self._pending = 0
        self._last = -interval_s

    def hit(self, n: int = 1, **fields: Any) -> None:
        with self._lock:
            self._pending += n
            now = time.monotonic()
            if now - self._last < self.interval_s:
                return
            count, self._pending, self._last = self._pending, 0, now
        getattr(self.log, self.level)(self.event, **{self.count_as: count}, **fields)


class _LibrdkafkaLog:
    """librdkafka's own log lines, into our JSON log at debug (error_cb already reports the trouble,
    throttled); without it they go to stderr in librdkafka's format. Served by poll, on our thread."""

    def __init__(self, log: Any) -> None:
        self._out = log

    def log(self, level: int, fmt: str, *args: Any) -> None:
        self._out.debug("librdkafka", level=level, message=fmt % args if args else fmt)


class AuditPublisher:
    def __init__(self, config: ProxyConfig, metrics: AuditMetrics) -> None:
        self.topic = config.audit.topic or ""
        self._conf = producer_config(config)
        self._producer: Any = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._degraded = False
        self._replace = False
        self.log = logs.get(component="audit_sink", topic=self.topic, bootstrap=self._conf["bootstrap.servers"])
        self._published = metrics.audit_records.labels(PUBLISHED)
        self._dropped = metrics.audit_records.labels(DROPPED)
        self._failed = metrics.audit_records.labels(FAILED)
        self._depth = metrics.audit_queue_depth
        self._drop_log = _Throttled(self.log, "audit_records_dropped")
        self._fail_log = _Throttled(self.log, "audit_records_failed")
        self._error_log = _Throttled(self.log, "audit_producer_error", count_as="errors")
        # Under a steady overload drops and deliveries alternate: "resumed" is throttled too.
        self._resumed_log = _Throttled(self.log, "audit_publishing_resumed", level="info", count_as="times")

    def start(self) -> None:
        self._producer = self._new_producer()
        self._thread = threading.Thread(target=self._poll_loop, name="txnguard-audit-poll", daemon=True)
        self._thread.start()
        self.log.info("audit_publisher_started", queue_max_records=self._conf["queue.buffering.max.messages"],
                      linger_ms=self._conf["linger.ms"])

    def _new_producer(self) -> Any:
        try:
            from confluent_kafka import Producer
        except ImportError:
            raise ConfigError("audit.topic: publishing needs confluent-kafka "
                              "(pip install 'txnguard[audit-kafka]')") from None
        return Producer({**self._conf, "error_cb": self._error, "logger": _LibrdkafkaLog(self.log)})

    # -- the loop's side: one C call per record, never a wait ------------------------------------

    def publish(self, key: str | None, value: bytes) -> None:
        producer = self._producer
        if producer is None or self._stopping.is_set():
            self._drop(1, "publisher_stopped")
            return
        try:
            producer.produce(self.topic, value, key, on_delivery=self._delivered)
        except BufferError:
            self._drop(1, "queue_full")
        except Exception as e:  # noqa: BLE001 - KafkaException (too large, fatal state): this record fails
            self._failed.inc()
            self._degraded = True
            self._fail_log.hit(reason="produce_refused", error=str(e))

    def _drop(self, n: int, reason: str) -> None:
        self._dropped.inc(n)
        self._degraded = True
        self._drop_log.hit(n, reason=reason, queue_depth=len(self._producer) if self._producer is not None else 0)

    # -- librdkafka's side: delivery reports and errors, served on our poll thread ----------------

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            self._published.inc()
            if self._degraded:
                self._degraded = False
                self._resumed_log.hit()
            return
        self._failed.inc()
        self._degraded = True
        self._fail_log.hit(reason=err.name().lower(), error=err.str())

    def _error(self, err: Any) -> None:
        """librdkafka's client-level errors (brokers down, authentication, fatal idempotence states)."""
        if err.fatal():
            # An idempotent producer in a fatal state refuses everything: start a fresh one.
            self.log.error("audit_producer_fatal", reason=err.name().lower(), error=err.str())
            self._replace = True
        else:
            self._error_log.hit(reason=err.name().lower(), error=err.str())

    def _poll_loop(self) -> None:
        while not self._stopping.is_set():
            producer = self._producer
            producer.poll(POLL_S)
            self._depth.set(len(producer))
            if self._replace:
                self._replace = False
                self._producer = self._new_producer()
                lost = len(producer)
                self._failed.inc(lost)
                self.log.warning("audit_producer_replaced", reason="fatal_error", records_lost=lost)

    # -- stop: a bounded wait for what is queued -----------------------------------------------------

    async def close(self, timeout_s: float) -> None:
        await asyncio.to_thread(self._close, timeout_s)

    def _close(self, timeout_s: float) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(POLL_S * 20)
        producer, self._producer = self._producer, None
        if producer is None:
            return
        left = producer.flush(timeout_s)  # serves the last delivery reports on this thread
        self._depth.set(0)
        if left:
            self._dropped.inc(left)
            self.log.warning("audit_records_dropped", records=left, reason="unsent_at_stop",
                             flush_timeout_s=timeout_s)
        self.log.info("audit_publisher_stopped", unsent=left)


def attach(config: ProxyConfig, metrics: AuditMetrics, audit: RecordLog, listen_port: int) -> AuditPublisher | None:
    """Proxy.start: name the proxy in its records; with `audit.topic`, start publishing to it."""
    audit.proxy_id = proxy_id(config, listen_port)
    if config.audit.topic is None:
        return None
    publisher = AuditPublisher(config, metrics)
    publisher.start()
    audit.attach(publisher)
    return publisher


async def detach(publisher: AuditPublisher | None, config: ProxyConfig) -> None:
    """Proxy.stop, after the last record (connections close first): flush with a bounded wait."""
    if publisher is not None:
        await publisher.close(config.audit.flush_timeout_s)

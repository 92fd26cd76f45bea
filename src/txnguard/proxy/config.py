"""Configuration: a YAML file, then TXNGUARD_* environment variables, then command-line flags.

The settings are pydantic models. Their types, choices (enums) and constraints are data, and three things
come from that one place: validation, the JSON Schema (`txnguard config-schema`, shipped as
deploy/schema/txnguard.schema.json for editors and the Helm chart) and the error messages, which name the
key, the value and what is wrong with it: `limits.max_in_flight: -3 is not a positive integer`
(`explain` reads what the value should have been from the schema). A few rules span several settings
(exactly one of password / password_file, low water below high water, ...): model validators say them.

Read at start-up (and on SIGHUP, for the policy) only: nothing here runs on the request path, where the
settings are plain attributes of frozen objects.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Self

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    PlainSerializer,
    PlainValidator,
    SecretStr,
    Strict,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict
from pydantic_settings.sources.utils import parse_env_vars

from txnguard.codecs.api_versions import UnknownApiKeys
from txnguard.policies.enforcement import Enforcement
from txnguard.policies.error_mapping import PRODUCE, TXN_OFFSET_COMMIT
from txnguard.policies.outcomes import Outcome


class ConfigError(ValueError):
    """A configuration value is missing, unknown or invalid."""


@dataclass(frozen=True)
class HostPort:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


# -- choices --------------------------------------------------------------------------------------------------


class ProxyMode(enum.StrEnum):
    """gateway: one proxy (or identical replicas) in front of the whole cluster, a listener per broker;
    sidecar: one proxy beside each broker, forwarding to that broker only."""

    GATEWAY = "gateway"
    SIDECAR = "sidecar"


class ClientAuth(enum.StrEnum):
    """none: clients do not authenticate to the brokers through the proxy; sasl: they do (the frame limit
    stays at limits.pre_auth_max_frame_bytes until their SASL exchange completes)."""

    NONE = "none"
    SASL = "sasl"


class LogLevel(enum.StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class CoordinatorEvidence(enum.StrEnum):
    """How the transaction coordinator is asked: DescribeTransactions (needs DESCRIBE on the transactional
    id) or AddPartitionsToTxn v4 VerifyOnly (the broker's own check; needs CLUSTER_ACTION, Kafka 3.5+)."""

    DESCRIBE_TRANSACTIONS = "describe_transactions"
    VERIFY_ONLY = "verify_only"


class SaslMechanism(enum.StrEnum):
    SCRAM_SHA_512 = "SCRAM-SHA-512"
    SCRAM_SHA_256 = "SCRAM-SHA-256"
    PLAIN = "PLAIN"


class ErrorApi(enum.StrEnum):
    """The requests whose refusal error a policy can choose per client family."""

    PRODUCE = PRODUCE
    TXN_OFFSET_COMMIT = TXN_OFFSET_COMMIT


class RefusedOutcome(enum.StrEnum):
    """The verification outcomes a policy can map to an error code (every Outcome but pass)."""

    NOT_IN_TRANSACTION = Outcome.NOT_IN_TRANSACTION.value
    LATE_WRITE = Outcome.LATE_WRITE.value
    COORDINATOR_UNAVAILABLE = Outcome.COORDINATOR_RETRIABLE.value
    PRODUCER_FENCED = Outcome.FENCED.value
    PRODUCER_ID_MAPPING = Outcome.PRODUCER_ID_MAPPING.value
    INVALID_RECORD = Outcome.INVALID_RECORD.value


# -- value types: constraints as data ---------------------------------------------------------------------------


def refusal(message: str, *at: str | int) -> PydanticCustomError:
    """A rule's own message; `at` names the setting below the one being validated (for model rules)."""
    return PydanticCustomError("txnguard", "{message}", {"message": message, "at": at})


def _readable_file(value: str) -> str:
    if not Path(value).is_file():
        raise refusal(f"{value!r} is not a readable file")
    return value


def parse_host_port(key: str, value: Any) -> HostPort:
    """host:port (an IPv6 host in brackets); raises ConfigError naming `key`."""
    try:
        return _host_port(value)
    except PydanticCustomError as e:
        raise ConfigError(f"{key}: {e.context['message'] if e.context else e}") from None


def _host_port(value: Any) -> HostPort:
    if isinstance(value, HostPort):
        return value
    if not isinstance(value, str) or ":" not in value:
        raise refusal(f"{value!r} is not host:port")
    host, _, port = value.strip().rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise refusal(f"{value!r} is not host:port with a port from 0 to 65535")
    return HostPort(host, int(port))


def _host_ports(value: Any) -> tuple[HostPort, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise refusal(f"{value!r} is not a list of host:port")
    return tuple(_host_port(v) for v in items)


_HOST_PORT_PATTERN = r"[^\s,]+:[0-9]{1,5}"
HOST_PORT_SCHEMA: dict[str, Any] = {"type": "string", "pattern": f"^{_HOST_PORT_PATTERN}$",
                                    "description": "host:port (an IPv6 host in brackets: [::1]:9092)"}
HOST_PORTS_SCHEMA: dict[str, Any] = {"anyOf": [
    {"type": "string", "pattern": rf"^{_HOST_PORT_PATTERN}(\s*,\s*{_HOST_PORT_PATTERN})*$",
     "description": "host:port[,host:port...]"},
    {"type": "array", "items": HOST_PORT_SCHEMA, "minItems": 1},
]}

Bool = Annotated[bool, Strict()]                      # true/false only: `yes` is not a boolean here
PositiveInt = Annotated[int, Strict(), Field(gt=0)]
NonNegativeInt = Annotated[int, Strict(), Field(ge=0)]
PositiveFloat = Annotated[float, Strict(), Field(gt=0)]
NonNegativeFloat = Annotated[float, Strict(), Field(ge=0)]
Share = Annotated[float, Strict(), Field(ge=0, le=1)]
Port = Annotated[int, Strict(), Field(ge=1, le=65535)]
NonEmptyStr = Annotated[str, Field(min_length=1)]
ReadableFile = Annotated[str, Field(min_length=1), AfterValidator(_readable_file)]
Address = Annotated[HostPort, PlainValidator(_host_port), PlainSerializer(str, return_type=str),
                    WithJsonSchema(HOST_PORT_SCHEMA)]
Addresses = Annotated[tuple[HostPort, ...], PlainValidator(_host_ports),
                      PlainSerializer(lambda v: [str(a) for a in v], return_type=list[str]),
                      WithJsonSchema(HOST_PORTS_SCHEMA)]
_INT_KEYS: dict[str, Any] = {"propertyNames": {"pattern": "^[0-9]+$"}}


def _wants(words: str) -> Any:
    """What a setting's value should be, in words, where the type's own words would say less (the schema
    carries it as `x-wants`; JSON Schema validators ignore keywords they do not know)."""
    return Field(json_schema_extra={"x-wants": words})


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


# -- the settings -----------------------------------------------------------------------------------------------


class ServerTls(_Section):
    """TLS terminated at the proxy's listeners."""

    certfile: ReadableFile
    """PEM certificate chain of the proxy's listeners."""
    keyfile: ReadableFile
    """PEM private key of certfile."""
    cafile: ReadableFile | None = None
    """Set to verify client certificates against this CA bundle."""
    require_client_cert: Bool = False
    """Refuse clients without a certificate signed by cafile (mTLS)."""


class UpstreamTls(_Section):
    """TLS (optionally mTLS) from the proxy to the brokers. `upstream_tls: true` is TLS with the system's CAs."""

    cafile: ReadableFile | None = None
    """CA bundle the brokers' certificates are checked against (default: the system's)."""
    certfile: ReadableFile | None = None
    """Client certificate for mTLS to the brokers."""
    keyfile: ReadableFile | None = None
    """Private key of certfile."""
    check_hostname: Bool = True
    """Check that a broker's certificate names the host connected to."""


class UpstreamAuth(_Section):
    """SASL for the proxy's own broker connections (verification, metadata, the hanging scan): its own
    principal, never a client's. Clients' SASL passes through untouched and is never mixed with this.
    Exactly one of password / password_file."""

    username: str
    """The proxy's own principal, User:<username>."""
    mechanism: SaslMechanism = SaslMechanism.SCRAM_SHA_512
    """The SASL mechanism the brokers' listener offers."""
    password: Annotated[SecretStr, Field(min_length=1)] | None = None
    """Never shown: not in a repr, a log line or `check-config --show` (TXNGUARD_UPSTREAM_AUTH__PASSWORD
    gives it as written)."""
    password_file: ReadableFile | None = None
    """A file holding the password, read at each connection: rotation needs no restart."""

    @field_validator("username")
    @classmethod
    def _named(cls, value: str) -> str:
        if not value:
            raise refusal("required (the proxy's own principal, User:<username>)")
        return value

    @model_validator(mode="after")
    def _one_secret(self) -> Self:
        if (self.password is None) == (self.password_file is None):
            raise refusal("set exactly one of password (e.g. TXNGUARD_UPSTREAM_AUTH__PASSWORD) or password_file")
        if self.password_file is not None and not self.secret():
            raise refusal(f"{self.password_file!r} is empty", "password_file")
        return self

    def secret(self) -> str:
        if self.password is not None:
            return self.password.get_secret_value()
        assert self.password_file is not None
        return Path(self.password_file).read_text().rstrip("\r\n")

    @property
    def principal(self) -> str:
        return f"User:{self.username}"


class Limits(_Section):
    """Bounds on what one client, and all of them together, may cost the proxy."""

    max_frame_bytes: PositiveInt = 100 * 1024 * 1024
    """Largest request or response frame accepted."""
    pre_auth_max_frame_bytes: PositiveInt = 512 * 1024
    """Largest frame before a client's SASL completes (client_auth: sasl); at most max_frame_bytes."""
    max_in_flight: PositiveInt = 1000
    """Requests in flight per client connection."""
    max_connections: PositiveInt = 10000
    """Client connections, all listeners together."""
    idle_timeout_s: PositiveFloat = 600.0
    """Close a connection idle this long (the broker's connections.max.idle.ms default)."""
    partial_frame_timeout_s: PositiveFloat = 30.0
    """Close a connection that started a frame and did not finish it within this time."""
    connect_timeout_s: PositiveFloat = 10.0
    """Bound on connecting to a broker."""
    high_water_bytes: PositiveInt = 4 * 1024 * 1024
    """Pause reading the other side while a write buffer holds more than this."""
    low_water_bytes: PositiveInt = 1 * 1024 * 1024
    """Resume below this; at most high_water_bytes."""
    drain_timeout_s: PositiveFloat = 30.0
    """SIGTERM: how long in-flight requests get before connections close."""

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.low_water_bytes > self.high_water_bytes:
            raise refusal(f"{self.low_water_bytes} is above limits.high_water_bytes", "low_water_bytes")
        if self.pre_auth_max_frame_bytes > self.max_frame_bytes:
            raise refusal("must not exceed limits.max_frame_bytes", "pre_auth_max_frame_bytes")
        return self


class Verification(_Section):
    """How the proxy proves that a transactional write belongs to an ongoing transaction."""

    enabled: Bool = True
    """Verify transactional Produce and TxnOffsetCommit requests (false: forward everything)."""
    leader_evidence: Bool = True
    """Ask the partition leader (DescribeProducers) before the coordinator."""
    coordinator_evidence: CoordinatorEvidence = CoordinatorEvidence.DESCRIBE_TRANSACTIONS
    timeout_s: PositiveFloat = 5.0
    """Bound on one verification's waits (one question to a coordinator or leader)."""
    evidence_ttl_ms: NonNegativeInt | None = None
    """How long evidence is trusted without asking again. Unset: the mode's default. What this proxy forwarded
    (an AddPartitionsToTxn and its success): a gateway until the EndTxn it forwards, a sidecar 0 (never reused).
    A coordinator's answer: this long in every mode, 0 (never reused) when unset."""
    registry_max_entries: PositiveInt = 100_000
    """Transactional ids remembered at most."""
    registry_idle_expiry_s: PositiveFloat = 900.0
    """Forget a transactional id not seen for this long."""
    hold_share: Annotated[Share, _wants("a share between 0 and 1 of the request's timeout (0: no hold; more than 1 "
                                        "would answer after the client gave up)")] = 0.8
    """While the coordinator does not answer (frozen, failing over, loading), hold the check and ask again,
    as the broker holds a Produce, for this share of the request's own timeout (Produce TimeoutMs;
    TxnOffsetCommit: the id's last Produce TimeoutMs, else client_request_timeout_ms), at most hold_max_ms.
    0 answers after one attempt of timeout_s; above 1 would answer after the client gave up."""
    hold_max_ms: PositiveInt = 30_000
    """Upper bound on one hold."""
    client_request_timeout_ms: PositiveInt = 30_000
    """The request timeout assumed for a TxnOffsetCommit whose producer's Produce timeout is not known."""
    end_txn_in_doubt_hold: Bool = True
    """KAFKA-17754: while an EndTxn this proxy forwarded is unanswered, hold the same producer's next
    AddPartitionsToTxn/AddOffsetsToTxn from another connection (within the hold bound; then
    CONCURRENT_TRANSACTIONS, which clients retry), and keep a broker connection whose client left until that
    EndTxn is answered."""
    end_txn_in_doubt_max_ms: PositiveInt = 60_000
    """An unanswered EndTxn stops being waited for after this long."""
    end_txn_hold_ms: PositiveInt = 1_000
    """One held request waits at most this long; then CONCURRENT_TRANSACTIONS (and it is held again)."""
    transaction_log: Bool = True
    """Follow the coordinator's own log, __transaction_state (DESCRIBE and READ on that topic), as evidence
    between this proxy's own and the coordinator's answer: every sidecar and gateway replica sees every
    AddPartitionsToTxn and EndTxn there, on Kafka 2.8 too. Not ready until it has read the log once."""
    transaction_log_wait_ms: PositiveInt = 500
    """A write the log does not pass at once waits at most this long for the follower to read the log up to its
    end as of the write's arrival; then the next source (the leader, the coordinator) decides."""
    transaction_log_idle_after_s: PositiveFloat | None = 30.0
    """The follower long-polls the log (a Fetch round or two per transaction of the cluster) while writes ask it;
    this long after the last write that asked it (none yet: from the start), it reads the log every
    `transaction_log_idle_read_s` instead, and a write that asks it then has it read to its end first (one Fetch),
    which makes it long-poll again. Unset: always long-poll. A gateway whose clients' writes all pass on what it
    saw itself then spends nothing per transaction on the log."""
    transaction_log_idle_read_s: PositiveFloat = 5.0
    """While the follower is idle, how often it reads the log to its end (readiness, the lag metrics, the ids
    that bypass txnguard)."""


class Audit(_Section):
    """Where audit records go: a JSON-lines file and/or a Kafka topic (see proxy/audit_sink.py)."""

    path: NonEmptyStr | None = None
    """JSON lines; "-" for stdout (the top-level audit_path is an alias)."""
    topic: NonEmptyStr | None = None
    """Set: publish every record to this topic too (needs txnguard[audit-kafka])."""
    bootstrap: Addresses = ()
    """The audit topic's cluster (default: upstream, straight to the brokers)."""
    proxy_id: NonEmptyStr | None = None
    """Names this proxy in its records (default: "<mode>@<advertised host>:<bootstrap listener port>")."""
    queue_max_records: PositiveInt = 100_000
    """Records waiting for Kafka; beyond: dropped and counted, never waited for."""
    linger_ms: PositiveInt = 100
    """Batching: how long a record may wait for others."""
    delivery_timeout_ms: PositiveInt = 300_000
    """Give up on a record after this (counted failed)."""
    flush_timeout_s: PositiveFloat = 5.0
    """Bounded wait for queued records on stop."""
    transaction_log_ids_interval_s: PositiveFloat | None = 3600.0
    """Every this often (checked once a second), one `transaction_log_id` record per transactional id active in the
    coordinator's log (at most 10,000 a round, the ids this proxy never saw first): the fleet report's table of
    clients that bypass txnguard. Unset: none. The first round comes one interval after the start."""
    producer: dict[str, str | int | float | bool] = {}
    """More librdkafka settings (security.protocol, sasl.*, ssl.*, ...); secrets among them are masked by
    `check-config --show`."""


class Health(_Section):
    """Transaction health checks the proxy runs itself (see proxy/hanging_monitor.py)."""

    hanging_scan_interval_s: PositiveFloat | None = None
    """Set: scan for hanging transactions this often (unset: off)."""
    hanging_max_transaction_timeout_s: PositiveFloat | None = None
    """Unset: an open transaction hangs once its coordinator no longer lists the partition and the producer's
    last write there is older than that transaction's own timeout plus `hanging_timeout_margin_s` (the cluster's
    transaction.max.timeout.ms, read with DescribeConfigs, when the coordinator cannot describe it). Set:
    find-hanging's rule, one --max-transaction-timeout for all."""
    hanging_timeout_margin_s: NonNegativeFloat = 10.0
    """Added to each transaction's own timeout (the coordinator checks for timed-out transactions every 10 s
    by default: transaction.abort.timed.out.transaction.cleanup.interval.ms)."""
    concurrent_transactions_budget_ms: NonNegativeFloat = 2000.0
    """CONCURRENT_TRANSACTIONS on AddPartitionsToTxn/AddOffsetsToTxn asked again by the proxy (KIP-609's
    idea): within this budget the client sees one slower answer instead of the error. 0 turns it off."""


class ModeRuleSection(_Section):
    """Matches a transactional id and/or a topic (globs); the first matching rule wins."""

    mode: Enforcement
    """The mode for what matches."""
    transactional_id: NonEmptyStr | None = None
    """Glob on the transactional id (unset: any)."""
    topic: NonEmptyStr | None = None
    """Glob on the topic (unset: any)."""


class FamilyRuleSection(_Section):
    """Names the client family of connections that match (in front of the shipped rules)."""

    family: NonEmptyStr
    """The family's name (kafka-python, librdkafka, java, ...: the keys of policy.errors)."""
    software_name: NonEmptyStr | None = None
    """Glob on the client's KIP-511 software name."""
    client_id: NonEmptyStr | None = None
    """Glob on the client id."""
    listener: NonEmptyStr | None = None
    """Glob on the listener's name."""


class PolicySection(_Section):
    """What a refused verification does, per transactional id and topic, and which error each client family
    sees (see txnguard.policies.policy). SIGHUP re-reads this section."""

    mode: Enforcement = Enforcement.ENFORCE
    """enforce: refuse; monitor: decide, log, count and audit, but forward; off: do not verify."""
    rules: tuple[ModeRuleSection, ...] = ()
    families: tuple[FamilyRuleSection, ...] = ()
    errors: dict[str, dict[ErrorApi, dict[RefusedOutcome, Annotated[int, Strict()]]]] = {}
    """Per family, per request, per outcome: the Kafka error code the client gets."""
    timeout_recovery: Bool = False
    """KIP-588 for old clients (gateway only): a transaction the coordinator timed out is answered so that
    the client bumps its epoch."""

    def as_mapping(self) -> dict[str, Any]:
        """The section as written (what txnguard.policies.policy.policy_from_config reads)."""
        return dict(self.model_dump(mode="json", exclude_unset=True))


@dataclass(frozen=True)
class Or:
    """A schema alternative the model takes before validation: `upstream_tls: true` (on, with defaults),
    `policy:` with nothing under it (null: the defaults)."""

    kind: str

    def __get_pydantic_json_schema__(self, core: Any, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        inner = handler(core)
        options = inner.pop("anyOf", None) or [{k: v for k, v in inner.items() if k != "description"}]
        kept = {k: v for k, v in inner.items() if k in ("description", "default") and "anyOf" not in inner}
        return {**kept, "anyOf": [*options, {"type": self.kind}]}


_SECTIONS = ("limits", "verification", "audit", "policy", "health")


def _tls_switch(value: Any) -> Any:
    return {} if value is True else None if value is False else value


class ProxyConfig(_Section):
    """txnguard's configuration (txnguard.yaml). Every setting can also be given as a TXNGUARD_* environment
    variable (TXNGUARD_LIMITS__MAX_IN_FLIGHT=50: `__` between levels); flags override both."""

    model_config = ConfigDict(title="txnguard configuration")

    mode: ProxyMode = ProxyMode.GATEWAY
    listen: Address = HostPort("127.0.0.1", 9292)
    """The bootstrap listener clients connect to (the default's port, and the broker ports after it, are used by
    no shipped layout: the sidecar layouts give 9192 to the broker's loopback listener)."""
    upstream: Addresses = ()
    """Required: the bootstrap host:port list of the real cluster (sidecar: exactly one, its own broker)."""
    advertised_host: Annotated[NonEmptyStr | None, _wants("a host name")] = None
    """The host name clients can resolve to this proxy (default: listen's host)."""
    broker_port_base: Port | None = None
    """Gateway: broker N is reachable at advertised_host:broker_port_base+N (default: listen's port + 1)."""
    broker_ports: Annotated[dict[int, Port], Field(json_schema_extra=_INT_KEYS)] = {}
    """Explicit broker node id -> listener port."""
    admin: Address | None = None
    """host:port of the admin HTTP endpoint (/metrics, /livez, /readyz)."""
    client_auth: ClientAuth = ClientAuth.NONE
    tls: ServerTls | None = None
    """TLS on the proxy's listeners (unset: plaintext)."""
    upstream_tls: Annotated[UpstreamTls | None, Or("boolean")] = None
    """TLS to the brokers: true for the system's CAs, or the settings below."""
    upstream_auth: UpstreamAuth | None = None
    """SASL for the proxy's own connections to an ACL cluster (unset: none)."""
    unknown_api_keys: UnknownApiKeys = UnknownApiKeys.PASS
    api_max_versions: Annotated[dict[int, NonNegativeInt], Field(json_schema_extra=_INT_KEYS)] = {}
    """Operator caps: API key -> highest version advertised to clients."""
    hide_transaction_version_2: Bool = False
    """ApiVersions shows clients transaction.version <= 1 (and TV1 API versions): Kafka 4.x clients fall back
    to KIP-890 part 1, which the proxy verifies."""
    limits: Annotated[Limits, Or("null")] = Limits()
    metadata_refresh_s: PositiveFloat = 10.0
    """How often the proxy refreshes its own view of the cluster."""
    ready_max_metadata_age_s: PositiveFloat = 30.0
    """/readyz fails while the proxy's last successful Metadata is older than this."""
    log_level: LogLevel = LogLevel.INFO
    """structlog's level: JSON lines on stderr."""
    verification: Annotated[Verification, Or("null")] = Verification()
    audit_path: NonEmptyStr | None = None
    """JSON lines; "-" for stdout (the same as audit.path)."""
    audit: Annotated[Audit, Or("null")] = Audit()
    policy: Annotated[PolicySection, Or("null")] = PolicySection()
    health: Annotated[Health, Or("null")] = Health()

    @field_validator("upstream_tls", mode="before")
    @classmethod
    def _tls_on(cls, value: Any) -> Any:
        return _tls_switch(value)

    @model_validator(mode="before")
    @classmethod
    def _as_given(cls, data: Any) -> Any:
        """A section given empty (`policy:` with everything under it commented out) takes its defaults.
        audit_path and audit.path are one setting: both end up equal, and a conflict is refused."""
        if not isinstance(data, Mapping):
            return data
        data = {k: v for k, v in data.items() if not (k in _SECTIONS and v is None)}  # `policy:` alone: defaults
        alias, section = data.get("audit_path"), data.get("audit")
        path = section.get("path") if isinstance(section, Mapping) else None
        if alias is not None and path is not None and alias != path:
            raise refusal(f"{alias!r} differs from audit.path {path!r} (set one)", "audit_path")
        if (alias is None) == (path is None) or not isinstance(section, Mapping | None):
            return data
        return {**data, "audit_path": alias or path, "audit": {**(section or {}), "path": alias or path}}

    @model_validator(mode="after")
    def _whole(self) -> Self:
        from txnguard.policies.policy import PolicyError, policy_from_config

        if not self.upstream:
            raise refusal("required (the bootstrap host:port list of the real cluster)", "upstream")
        if self.mode is ProxyMode.SIDECAR and len(self.upstream) != 1:
            raise refusal(f"sidecar mode forwards to exactly one broker, got {len(self.upstream)}", "upstream")
        try:
            policy_from_config(self.policy.as_mapping())  # the proxy builds it again on start and SIGHUP
        except PolicyError as e:
            raise refusal(str(e)) from None
        return self

    @property
    def advertised(self) -> str:
        return self.advertised_host or self.listen.host

    def broker_port(self, node_id: int) -> int:
        if node_id in self.broker_ports:
            return self.broker_ports[node_id]
        if self.broker_port_base is not None:
            return self.broker_port_base + node_id
        if self.listen.port == 0:
            return 0  # an ephemeral bootstrap port: ephemeral broker ports too
        return self.listen.port + 1 + node_id


SECRET_SETTING = re.compile(r"password|secret|token|credential|\.pem$", re.IGNORECASE)


# -- error messages from the schema ----------------------------------------------------------------------------


class _SchemaGenerator(GenerateJsonSchema):
    def encode_default(self, dft: Any) -> Any:
        return str(dft) if isinstance(dft, HostPort) else super().encode_default(dft)


def _one_line(node: Any) -> Any:
    """Docstrings' line breaks out of descriptions (editors show them as one paragraph)."""
    if isinstance(node, dict):
        return {k: " ".join(v.split()) if k == "description" and isinstance(v, str) else _one_line(v)
                for k, v in node.items()}
    if isinstance(node, list):
        return [_one_line(v) for v in node]
    return node


def schema() -> dict[str, Any]:
    """The configuration's JSON Schema (draft 2020-12), as `txnguard config-schema` prints it."""
    out = ProxyConfig.model_json_schema(schema_generator=_SchemaGenerator)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **_one_line(out)}


_SCHEMA: dict[str, Any] = {}


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = _SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[1]]
    return node


def _branches(node: dict[str, Any]) -> list[dict[str, Any]]:
    node = _resolve(node)
    options = node.get("anyOf") or node.get("oneOf")
    if not options:
        return [node]
    return [b for o in options for b in _branches(o) if b.get("type") != "null"]


def _at(loc: tuple[str | int, ...]) -> list[dict[str, Any]]:
    """The schemas a setting's value may take (several for a union), found by its location."""
    if not _SCHEMA:
        _SCHEMA.update(schema())
    nodes = [_SCHEMA]
    for part in loc:
        found: list[dict[str, Any]] = []
        for node in (b for n in nodes for b in _branches(n)):
            if isinstance(part, int) and "items" in node:
                found.append(node["items"])
            elif str(part) in node.get("properties", {}):
                found.append(node["properties"][str(part)])
            elif isinstance(node.get("additionalProperties"), dict):
                found.append(node["additionalProperties"])
        nodes = found
    return nodes


def _number(node: dict[str, Any], noun: str) -> str:
    lo, hi = node.get("minimum"), node.get("maximum")
    if node.get("exclusiveMinimum") == 0 and hi is None:
        return f"a positive {noun}"
    if lo is not None and hi is not None:
        return f"{'an' if noun == 'integer' else 'a'} {noun} from {lo:g} to {hi:g}"
    if lo == 0:
        return f"a non-negative {noun}"
    return f"{'an' if noun == 'integer' else 'a'} {noun}"


def wants(node: dict[str, Any]) -> str:
    """What a value of this schema is, in words: 'a positive integer', 'one of gateway, sidecar', ..."""
    if "x-wants" in node:
        return str(node["x-wants"])
    options = _branches(node)
    if len(options) > 1:
        return " or ".join(wants(o) for o in options)
    node = options[0]
    if node.get("pattern") == _INT_KEYS["propertyNames"]["pattern"]:
        return "a non-negative integer"
    if "enum" in node:
        return f"one of {', '.join(str(v) for v in node['enum'])}"
    kind = node.get("type")
    if kind == "boolean":
        return "true or false"
    if kind in ("integer", "number"):
        return _number(node, kind)
    if kind == "string":
        if node.get("format") == "password" or node.get("minLength") == 1:
            return "a non-empty string"
        return node.get("description") or "a string"
    if kind == "object":
        return "a mapping"
    if kind == "array":
        return "a list"
    return "valid"


def _key(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out


def explain(error: Mapping[str, Any]) -> str:
    """One pydantic error as `key: value is not what it should be`, read from the schema. A secret's value
    is never shown."""
    loc, kind, value = tuple(error["loc"]), error["type"], error.get("input")
    if kind == "txnguard":
        full = _key(loc + tuple(error["ctx"]["at"]))
        message = error["ctx"]["message"]
        return f"{full}: {message}" if full else str(message)
    if loc and loc[-1] == "[key]":  # a mapping's key
        parent = _at(loc[:-2])
        names = [n.get("propertyNames", {}) for n in parent]
        return f"{_key(loc[:-1])}: {value!r} is not {' or '.join(wants(n) for n in names if n) or 'a valid key'}"
    if kind == "extra_forbidden":
        known = sorted({k for n in _at(loc[:-1]) for b in _branches(n) for k in b.get("properties", {})})
        return f"{_key(loc)}: unknown setting (known: {', '.join(known)})"
    if kind == "missing":
        return f"{_key(loc)}: required"
    nodes = _at(loc)
    wanted = " or ".join(dict.fromkeys(wants(n) for n in nodes)) or "valid"
    if any(b.get("writeOnly") for n in nodes for b in _branches(n)):
        quote = "" if isinstance(value, str) else " (quote it in YAML)"
        return f"{_key(loc)}: must be {wanted}{quote}; the value is not shown"
    if kind.startswith(("model_", "dict_", "dataclass_")) and wanted == "valid":
        wanted = "a mapping"
    return f"{_key(loc)}: {value!r} is not {wanted}"


def from_mapping(raw: Mapping[str, Any]) -> ProxyConfig:
    try:
        return ProxyConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError("\n".join(explain(err) for err in e.errors(include_url=False))) from None


# -- the YAML file ----------------------------------------------------------------------------------------------


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's booleans: only true/false.

    YAML 1.1 reads on/off/yes/no as booleans, so `mode: off` (a policy mode) arrived
    as False and was refused. Settings that are booleans are spelt true/false.
    """


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def parse_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Yaml12Loader)  # a SafeLoader subclass: no arbitrary objects


def load_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None
    try:
        raw = parse_yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of settings")
    return raw


# -- the environment (pydantic-settings) -------------------------------------------------------------------------

ENV_PREFIX = "TXNGUARD_"
# TXNGUARD_* variables of the tools around the proxy (test harness, image build), not settings.
NOT_SETTINGS = frozenset({"TXNGUARD_CACHE", "TXNGUARD_TEST_DIR", "TXNGUARD_IMAGE_CACHE", "TXNGUARD_KCAT",
                          "TXNGUARD_MAX_CLUSTERS", "TXNGUARD_REPORT_SCREENSHOT", "TXNGUARD_SARAMA_PACED"})


class EnvironmentSettings(BaseSettings, ProxyConfig):
    """The settings as pydantic-settings sees them: TXNGUARD_LIMITS__MAX_IN_FLIGHT is limits.max_in_flight."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__", case_sensitive=False)


class EnvironmentSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given environ. Values are read as YAML scalars, as in the
    file, so numbers and booleans keep their types and `off` stays a word; a password is taken as written
    (as YAML, "0123" or "true" would not be the password)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(EnvironmentSettings)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)

    def decode_complex_value(self, field_name: str, field: Any, value: Any) -> Any:
        return value  # read as YAML below, like every other value

    def __call__(self) -> dict[str, Any]:
        fields = {f"{ENV_PREFIX}{name}".upper() for name in ProxyConfig.model_fields}
        for name in sorted(self._environ):
            top = name.upper().split("__")[0]
            if name.upper().startswith(ENV_PREFIX) and top not in fields and name.upper() not in NOT_SETTINGS:
                raise ConfigError(f"{name}: unknown setting (known: "
                                  f"{', '.join(sorted(f.lower()[len(ENV_PREFIX):] for f in fields))})")
        return dict(_scalars(super().__call__()))


def _scalars(node: Any, name: str = "") -> Any:
    if isinstance(node, dict):
        return {k: _scalars(v, k) for k, v in node.items()}
    if not isinstance(node, str) or not node or name == "password":
        return node
    try:  # `[::1]:9092` is not YAML (a flow sequence, then text) but is a fine host:port
        return parse_yaml(node)
    except yaml.YAMLError:
        return node


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """TXNGUARD_MODE=sidecar, TXNGUARD_UPSTREAM=a:1,b:2, TXNGUARD_LIMITS__MAX_IN_FLIGHT=50, ..."""
    return EnvironmentSource(environ)()


# -- loading, and where each value came from ---------------------------------------------------------------------

DEFAULT, FILE, ENVIRONMENT, FLAG = "default", "file", "environment", "flag"


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge(dict(out[k]), v)
        else:
            out[k] = v
    return out


def _leaves(node: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    out: dict[tuple[str, ...], Any] = {}
    for k, v in node.items():
        if isinstance(v, Mapping) and v and str(k) not in ("producer", "errors", "broker_ports", "api_max_versions"):
            out.update(_leaves(v, (*prefix, str(k))))
        else:
            out[(*prefix, str(k))] = v
    return out


@dataclass(frozen=True)
class Loaded:
    """A configuration and, for each setting given, where it came from: ("file", path), ("environment",
    TXNGUARD_...), ("flag", --name). A setting not in `origins` has its default."""

    config: ProxyConfig
    origins: Mapping[tuple[str, ...], tuple[str, str]]


def load_with_origins(
    path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Loaded:
    layers: list[tuple[str, dict[str, Any], Any]] = [
        (FILE, load_file(path) if path else {}, lambda key: str(path)),
        (ENVIRONMENT, env_overrides(os.environ if environ is None else environ),
         lambda key: ENV_PREFIX + "__".join(key).upper()),
        (FLAG, {k: v for k, v in (overrides or {}).items() if v is not None},
         lambda key: "--" + key[0].replace("_", "-")),
    ]
    raw: dict[str, Any] = {}
    origins: dict[tuple[str, ...], tuple[str, str]] = {}
    for source, layer, where in layers:
        raw = _merge(raw, layer)
        for key in _leaves(layer):
            origins = {k: o for k, o in origins.items() if k[:len(key)] != key and key[:len(k)] != k}
            origins[key] = (source, where(key))
    if ("audit_path",) in origins:
        origins.setdefault(("audit", "path"), origins[("audit_path",)])
    if ("audit", "path") in origins:
        origins.setdefault(("audit_path",), origins[("audit", "path")])
    return Loaded(from_mapping(raw), origins)


def load(
    path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ProxyConfig:
    return load_with_origins(path, overrides, environ).config

"""Configuration: a YAML file, then TXNGUARD_* environment variables, then command-line flags.

Validation happens once, at load, and an error names the key, the value and what
is wrong with it: `limits.max_in_flight: -3 is not a positive integer`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration value is missing, unknown or invalid."""


@dataclass(frozen=True)
class HostPort:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class ServerTls:
    """TLS terminated at the proxy's listeners."""

    certfile: str
    keyfile: str
    cafile: str | None = None          # set to verify client certificates
    require_client_cert: bool = False


@dataclass(frozen=True)
class UpstreamTls:
    """TLS (optionally mTLS) from the proxy to the brokers."""

    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    check_hostname: bool = True


SASL_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")


@dataclass(frozen=True)
class UpstreamAuth:
    """SASL for the proxy's own broker connections (verification, metadata, the hanging scan): its own
    principal, never a client's. Clients' SASL passes through untouched and is never mixed with this."""

    username: str
    mechanism: str = "SCRAM-SHA-512"
    password: str | None = field(default=None, repr=False)   # never in a repr, hence never in a log line
    password_file: str | None = None                         # read at each connection: rotation needs no restart

    def secret(self) -> str:
        if self.password is not None:
            return self.password
        assert self.password_file is not None
        return Path(self.password_file).read_text().rstrip("\r\n")

    @property
    def principal(self) -> str:
        return f"User:{self.username}"


@dataclass(frozen=True)
class Limits:
    max_frame_bytes: int = 100 * 1024 * 1024
    pre_auth_max_frame_bytes: int = 512 * 1024
    max_in_flight: int = 1000                # per client connection
    max_connections: int = 10000
    idle_timeout_s: float = 600.0            # the broker's connections.max.idle.ms default
    partial_frame_timeout_s: float = 30.0
    connect_timeout_s: float = 10.0
    high_water_bytes: int = 4 * 1024 * 1024  # pause the other side above this write buffer
    low_water_bytes: int = 1 * 1024 * 1024
    drain_timeout_s: float = 30.0


COORDINATOR_EVIDENCE = ("describe_transactions", "verify_only")


@dataclass(frozen=True)
class Verification:
    enabled: bool = True
    leader_evidence: bool = True     # ask the partition leader (DescribeProducers) before the coordinator
    # How the coordinator is asked: DescribeTransactions (needs DESCRIBE on the transactional id)
    # or AddPartitionsToTxn v4 VerifyOnly (the broker's own check; needs CLUSTER_ACTION, Kafka 3.5+).
    coordinator_evidence: str = "describe_transactions"
    timeout_s: float = 5.0           # bound on one verification's waits
    evidence_ttl_ms: int | None = None  # None: the mode's default (gateway: until EndTxn; sidecar: 0)
    registry_max_entries: int = 100_000
    registry_idle_expiry_s: float = 900.0
    # While the coordinator does not answer (frozen, failing over, loading), hold the check and ask
    # again, as the broker holds a Produce, for this share of the request's own timeout (Produce
    # TimeoutMs; TxnOffsetCommit: the id's last Produce TimeoutMs, else client_request_timeout_ms),
    # at most hold_max_ms. 0 answers after one attempt of timeout_s. See verification/holds.py.
    hold_share: float = 0.8
    hold_max_ms: int = 30_000
    client_request_timeout_ms: int = 30_000
    # KAFKA-17754 (verification/in_doubt.py): while an EndTxn this proxy forwarded is unanswered, hold the
    # same producer's next AddPartitionsToTxn/AddOffsetsToTxn from another connection (within the hold
    # bound above; then CONCURRENT_TRANSACTIONS, which clients retry), and keep a broker connection whose
    # client left until that EndTxn is answered. An EndTxn stops being waited for after this many ms.
    end_txn_in_doubt_hold: bool = True
    end_txn_in_doubt_max_ms: int = 60_000
    end_txn_hold_ms: int = 1_000     # one held request, at most: then CONCURRENT_TRANSACTIONS (held again)


@dataclass(frozen=True)
class Audit:
    """Where audit records go: a JSON-lines file and/or a Kafka topic (see proxy/audit_sink.py)."""

    path: str | None = None              # JSON lines; "-" for stdout (the top-level audit_path is an alias)
    topic: str | None = None             # set: publish every record to this topic too
    bootstrap: tuple[HostPort, ...] = ()  # the audit topic's cluster; default: upstream (straight to brokers)
    proxy_id: str | None = None          # default: "<mode>@<advertised host>:<bootstrap listener port>"
    queue_max_records: int = 100_000     # records waiting for Kafka; beyond: dropped and counted
    linger_ms: int = 100                 # batching: how long a record may wait for others
    delivery_timeout_ms: int = 300_000   # give up on a record after this (counted failed)
    flush_timeout_s: float = 5.0         # bounded wait for queued records on stop
    producer: Mapping[str, Any] = field(default_factory=dict)  # more librdkafka settings (security, ...)


@dataclass(frozen=True)
class Health:
    """Transaction health checks the proxy runs itself (see proxy/hanging.py)."""

    hanging_scan_interval_s: float | None = None   # set: scan for hanging transactions this often (off: None)
    hanging_max_transaction_timeout_s: float = 900.0  # find-hanging's --max-transaction-timeout (15 min)
    # CONCURRENT_TRANSACTIONS on AddPartitionsToTxn/AddOffsetsToTxn asked again by the proxy (KIP-609 idea):
    # within this budget the client sees one slower answer instead of the error; 0 turns it off.
    concurrent_transactions_budget_ms: float = 2000.0


@dataclass(frozen=True)
class ProxyConfig:
    mode: str = "gateway"                               # gateway | sidecar
    listen: HostPort = HostPort("127.0.0.1", 9192)      # the bootstrap listener
    upstream: tuple[HostPort, ...] = ()
    advertised_host: str | None = None                  # default: listen.host
    broker_port_base: int | None = None                 # gateway: port = base + node id (default listen.port + 1)
    broker_ports: Mapping[int, int] = field(default_factory=dict)  # explicit node id -> port
    admin: HostPort | None = None
    client_auth: str = "none"                           # none | sasl (frame limit until SASL completes)
    tls: ServerTls | None = None
    upstream_tls: UpstreamTls | None = None
    upstream_auth: UpstreamAuth | None = None           # SASL for the proxy's own connections (ACL clusters)
    unknown_api_keys: str = "pass"                      # pass | strip
    api_max_versions: Mapping[int, int] = field(default_factory=dict)
    # ApiVersions shows clients transaction.version <= 1 (and TV1 API versions): Kafka 4.x clients
    # fall back to KIP-890 part 1, which the proxy verifies (see codecs/api_versions.py)
    hide_transaction_version_2: bool = False
    limits: Limits = field(default_factory=Limits)
    metadata_refresh_s: float = 10.0
    ready_max_metadata_age_s: float = 30.0
    log_level: str = "info"
    verification: Verification = field(default_factory=Verification)
    audit_path: str | None = None                       # JSON lines; "-" for stdout (same as audit.path)
    audit: Audit = field(default_factory=Audit)
    policy: Mapping[str, Any] = field(default_factory=dict)  # see txnguard.policies.policy
    health: Health = field(default_factory=Health)

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


# -- parsing -----------------------------------------------------------------------------------


def parse_host_port(key: str, value: Any) -> HostPort:
    if not isinstance(value, str) or ":" not in value:
        raise ConfigError(f"{key}: {value!r} is not host:port")
    host, _, port = value.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{key}: {value!r} is not host:port with a port from 0 to 65535")
    return HostPort(host, int(port))


def _host_ports(key: str, value: Any) -> tuple[HostPort, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise ConfigError(f"{key}: {value!r} is not a list of host:port")
    return tuple(parse_host_port(key, v.strip() if isinstance(v, str) else v) for v in items)


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(choices)}")
    return str(value)


def _positive_number(key: str, value: Any, *, integer: bool) -> Any:
    ok = isinstance(value, int) and not isinstance(value, bool) if integer else \
        isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or value <= 0:
        raise ConfigError(f"{key}: {value!r} is not a positive {'integer' if integer else 'number'}")
    return value


def _int_map(key: str, value: Any) -> dict[int, int]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: {value!r} is not a mapping of integers")
    out: dict[int, int] = {}
    for k, v in value.items():
        try:
            out[int(k)] = int(v)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}.{k}: {v!r} is not an integer") from None
    return out


def _check_file(key: str, value: Any) -> str:
    if not isinstance(value, str) or not Path(value).is_file():
        raise ConfigError(f"{key}: {value!r} is not a readable file")
    return value


def _dataclass_from(key: str, cls: type[Any], raw: Any) -> Any:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{key}: {raw!r} is not a mapping")
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(raw) - set(names)
    if unknown:
        raise ConfigError(f"{key}.{sorted(unknown)[0]}: unknown setting (known: {', '.join(sorted(names))})")
    values: dict[str, Any] = {}
    for name, v in raw.items():
        f = names[name]
        sub = f"{key}.{name}"
        if f.type in ("bool",):
            if not isinstance(v, bool):
                raise ConfigError(f"{sub}: {v!r} is not true or false")
        elif f.type in ("int",):
            v = _positive_number(sub, v, integer=True)
        elif f.type in ("float",):
            v = float(_positive_number(sub, v, integer=False))
        elif name in ("certfile", "keyfile", "cafile") and v is not None:
            v = _check_file(sub, v)
        values[name] = v
    try:
        return cls(**values)
    except TypeError as e:
        raise ConfigError(f"{key}: {e}") from None


_TOP_LEVEL = {f.name for f in dataclasses.fields(ProxyConfig)}


def from_mapping(raw: Mapping[str, Any]) -> ProxyConfig:  # noqa: C901 - one branch per setting
    unknown = set(raw) - _TOP_LEVEL
    if unknown:
        raise ConfigError(f"{sorted(unknown)[0]}: unknown setting (known: {', '.join(sorted(_TOP_LEVEL))})")
    kw: dict[str, Any] = {}
    for key, v in raw.items():
        if key == "mode":
            kw[key] = _choice(key, v, ("gateway", "sidecar"))
        elif key in ("listen", "admin"):
            kw[key] = None if v is None and key == "admin" else parse_host_port(key, v)
        elif key == "upstream":
            kw[key] = _host_ports(key, v)
        elif key == "advertised_host":
            if not isinstance(v, str) or not v:
                raise ConfigError(f"{key}: {v!r} is not a host name")
            kw[key] = v
        elif key == "broker_port_base":
            kw[key] = _positive_number(key, v, integer=True)
        elif key in ("broker_ports", "api_max_versions"):
            kw[key] = _int_map(key, v)
        elif key == "client_auth":
            kw[key] = _choice(key, v, ("none", "sasl"))
        elif key == "unknown_api_keys":
            kw[key] = _choice(key, v, ("pass", "strip"))
        elif key == "hide_transaction_version_2":
            if not isinstance(v, bool):
                raise ConfigError(f"{key}: {v!r} is not true or false")
            kw[key] = v
        elif key == "log_level":
            kw[key] = _choice(key, v, ("debug", "info", "warning", "error"))
        elif key in ("metadata_refresh_s", "ready_max_metadata_age_s"):
            kw[key] = float(_positive_number(key, v, integer=False))
        elif key == "tls":
            kw[key] = None if v is None else _dataclass_from(key, ServerTls, v)
        elif key == "upstream_tls":
            kw[key] = None if v is None else _dataclass_from(key, UpstreamTls, v if v is not True else {})
        elif key == "upstream_auth":
            kw[key] = None if v is None else _upstream_auth(v)
        elif key == "limits":
            kw[key] = _dataclass_from(key, Limits, v)
        elif key == "verification":
            kw[key] = _verification(v)
        elif key in ("audit", "audit_path"):
            kw["audit"] = _audit(raw)  # both keys: one Audit, and audit_path kept equal to audit.path
            kw["audit_path"] = kw["audit"].path
        elif key == "policy":
            kw[key] = _policy(v)
        elif key == "health":
            kw[key] = _health(v)
    cfg = ProxyConfig(**kw)
    return validate(cfg)


def _upstream_auth(raw: Any) -> UpstreamAuth:
    """Exactly one of password / password_file (an env override of one must not leave the other in force
    silently); error messages name the setting, never the secret."""
    auth: UpstreamAuth = _dataclass_from("upstream_auth", UpstreamAuth, raw)
    if auth.mechanism not in SASL_MECHANISMS:
        raise ConfigError(f"upstream_auth.mechanism: {auth.mechanism!r} is not one of {', '.join(SASL_MECHANISMS)}")
    if not isinstance(auth.username, str) or not auth.username:
        raise ConfigError("upstream_auth.username: required (the proxy's own principal, User:<username>)")
    if (auth.password is None) == (auth.password_file is None):
        raise ConfigError("upstream_auth: set exactly one of password (e.g. TXNGUARD_UPSTREAM_AUTH__PASSWORD) "
                          "or password_file")
    if auth.password is not None and (not isinstance(auth.password, str) or not auth.password):
        raise ConfigError("upstream_auth.password: must be a non-empty string (quote it in YAML)")
    if auth.password_file is not None:
        _check_file("upstream_auth.password_file", auth.password_file)
        if not auth.secret():
            raise ConfigError(f"upstream_auth.password_file: {auth.password_file!r} is empty")
    return auth


def _verification(raw: Any) -> Verification:
    if isinstance(raw, Mapping) and raw.get("evidence_ttl_ms") is not None:
        ttl = raw["evidence_ttl_ms"]
        if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 0:
            raise ConfigError(f"verification.evidence_ttl_ms: {ttl!r} is not a non-negative integer")
        rest = _verification({k: v for k, v in raw.items() if k != "evidence_ttl_ms"})
        return dataclasses.replace(rest, evidence_ttl_ms=ttl)
    if isinstance(raw, Mapping) and "hold_share" in raw:
        share = raw["hold_share"]
        if not isinstance(share, int | float) or isinstance(share, bool) or not 0 <= share <= 1:
            raise ConfigError(f"verification.hold_share: {share!r} is not a share between 0 and 1 of the request's "
                              "timeout (0: no hold; more than 1 would answer after the client gave up)")
        rest = _verification({k: v for k, v in raw.items() if k != "hold_share"})
        return dataclasses.replace(rest, hold_share=float(share))
    result: Verification = _dataclass_from("verification", Verification, raw)
    if result.coordinator_evidence not in COORDINATOR_EVIDENCE:
        raise ConfigError(f"verification.coordinator_evidence: {result.coordinator_evidence!r} is not one of "
                          f"{', '.join(COORDINATOR_EVIDENCE)}")
    return result


def _audit(raw: Mapping[str, Any]) -> Audit:
    alias, section = raw.get("audit_path"), raw.get("audit") or {}
    if alias is not None and not isinstance(alias, str):
        raise ConfigError(f"audit_path: {alias!r} is not a file path or -")
    if not isinstance(section, Mapping):
        raise ConfigError(f"audit: {section!r} is not a mapping")
    special = {"path", "topic", "proxy_id", "bootstrap", "producer"}
    values: dict[str, Any] = {}
    for name in ("path", "topic", "proxy_id"):
        v = section.get(name)
        if v is not None and (not isinstance(v, str) or not v):
            raise ConfigError(f"audit.{name}: {v!r} is not a non-empty string")
        values[name] = v
    if alias is not None and values["path"] is not None and alias != values["path"]:
        raise ConfigError(f"audit_path: {alias!r} differs from audit.path {values['path']!r} (set one)")
    values["path"] = values["path"] or alias
    if section.get("bootstrap") is not None:
        values["bootstrap"] = _host_ports("audit.bootstrap", section["bootstrap"])
    producer = section.get("producer") or {}
    if not isinstance(producer, Mapping) or not all(isinstance(k, str) for k in producer):
        raise ConfigError(f"audit.producer: {producer!r} is not a mapping of librdkafka settings")
    values["producer"] = dict(producer)
    rest: Audit = _dataclass_from("audit", Audit, {k: v for k, v in section.items() if k not in special})
    return dataclasses.replace(rest, **values)


def _health(raw: Any) -> Health:
    if raw is None:
        return Health()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"health: {raw!r} is not a mapping")
    names = {f.name for f in dataclasses.fields(Health)}
    unknown = set(raw) - names
    if unknown:
        raise ConfigError(f"health.{sorted(unknown)[0]}: unknown setting (known: {', '.join(sorted(names))})")
    values: dict[str, Any] = {}
    for k, v in raw.items():
        if v is None and k == "hanging_scan_interval_s":
            values[k] = None
        elif k == "concurrent_transactions_budget_ms" and v == 0 and not isinstance(v, bool):
            values[k] = 0.0  # off: the client gets CONCURRENT_TRANSACTIONS as the coordinator said it
        else:
            values[k] = float(_positive_number(f"health.{k}", v, integer=False))
    return Health(**values)


def _policy(raw: Any) -> Mapping[str, Any]:
    from txnguard.policies.policy import PolicyError, policy_from_config

    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"policy: {raw!r} is not a mapping")
    try:
        policy_from_config(raw)  # validate now; the proxy builds it again on start and SIGHUP
    except PolicyError as e:
        raise ConfigError(str(e)) from None
    return dict(raw)


def validate(cfg: ProxyConfig) -> ProxyConfig:
    if not cfg.upstream:
        raise ConfigError("upstream: required (the bootstrap host:port list of the real cluster)")
    if cfg.mode == "sidecar" and len(cfg.upstream) != 1:
        raise ConfigError(f"upstream: sidecar mode forwards to exactly one broker, got {len(cfg.upstream)}")
    lim = cfg.limits
    if lim.low_water_bytes > lim.high_water_bytes:
        raise ConfigError(f"limits.low_water_bytes: {lim.low_water_bytes} is above limits.high_water_bytes")
    if lim.pre_auth_max_frame_bytes > lim.max_frame_bytes:
        raise ConfigError("limits.pre_auth_max_frame_bytes: must not exceed limits.max_frame_bytes")
    return cfg


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


ENV_PREFIX = "TXNGUARD_"


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """TXNGUARD_MODE=sidecar, TXNGUARD_UPSTREAM=a:1,b:2, TXNGUARD_LIMITS__MAX_IN_FLIGHT=50, ...

    Values are parsed as YAML scalars, so numbers and booleans keep their types.
    """
    out: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name in ("TXNGUARD_CACHE", "TXNGUARD_TEST_DIR"):
            continue
        path = name[len(ENV_PREFIX):].lower().split("__")
        # A password is taken as given: parsed as YAML, "0123" or "true" would not be the password.
        parsed = value if path[-1] == "password" else _env_value(value)
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = parsed
    return out


def _env_value(value: str) -> Any:
    """A YAML scalar, so numbers and booleans keep their types; anything else stays the string given.

    `[::1]:9092` is not YAML (a flow sequence followed by text) but is a fine host:port.
    """
    if not value:
        return value
    try:
        return parse_yaml(value)
    except yaml.YAMLError:
        return value


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge(dict(out[k]), v)
        else:
            out[k] = v
    return out


def load(
    path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ProxyConfig:
    raw: dict[str, Any] = load_file(path) if path else {}
    raw = _merge(raw, env_overrides(os.environ if environ is None else environ))
    raw = _merge(raw, {k: v for k, v in (overrides or {}).items() if v is not None})
    return from_mapping(raw)

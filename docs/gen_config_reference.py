"""Generates the configuration reference page (reference/configuration.md) at docs build time.

A MkDocs hook (mkdocs.yml `hooks:`): `on_page_markdown` replaces the stub docs/reference/configuration.md with
the page generated from the configuration's own definition, so the reference cannot drift from the code. This is
the one place the page's content comes from.

Today the definition is the dataclasses of `txnguard.proxy.config` (types, defaults, and the comments beside
each field, read from the source); `render()` is the only function that knows that. When the configuration
becomes a schema (pydantic models, `txnguard config-schema`), replace `_sections()` with a walk over the
schema's properties (title, type, default, description, enum) and keep the page's layout.

Run it alone to print the page: `python docs/gen_config_reference.py`.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import re
import sys
import tokenize
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGE = "reference/configuration.md"


def _import_config() -> Any:
    src = str(ROOT / "src")
    if src not in sys.path:
        sys.path.insert(0, src)  # this checkout's code, also when another txnguard is installed
    from txnguard.policies import policy
    from txnguard.proxy import config

    return config, policy


def _field_comments(cls: type) -> dict[str, str]:
    """Each field's comment: the `# ...` at the end of its line, after the comment lines just above it."""
    source = inspect.getsource(cls)
    comments: dict[str, str] = {}
    above: list[str] = []
    names = {f.name for f in dataclasses.fields(cls)}
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    line_tokens: dict[int, list[tokenize.TokenInfo]] = {}
    for tok in tokens:
        line_tokens.setdefault(tok.start[0], []).append(tok)
    for lineno in sorted(line_tokens):
        toks = [t for t in line_tokens[lineno] if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                                                                   tokenize.DEDENT)]
        if not toks:
            above = []
            continue
        if toks[0].type == tokenize.COMMENT:
            above.append(toks[0].string.lstrip("#").strip())
            continue
        first = toks[0]
        if first.type == tokenize.NAME and first.string in names and len(toks) > 1 and toks[1].string == ":":
            trailing = [t.string.lstrip("#").strip() for t in toks if t.type == tokenize.COMMENT]
            comments[first.string] = " ".join([*above, *trailing]).strip()
        above = []
    return comments


_TYPE_WORDS = {"str": "string", "int": "integer", "float": "number", "bool": "true/false", "ServerTls": "section",
               "UpstreamTls": "section (`true`: the defaults)", "UpstreamAuth": "section"}


def _type_name(tp: Any) -> str:
    text = tp if isinstance(tp, str) else getattr(tp, "__name__", str(tp))
    text = (text.replace("tuple[HostPort, ...]", "list of host:port").replace("HostPort", "host:port")
            .replace("Mapping[str, Any]", "mapping").replace("Mapping[int, int]", "mapping of integers")
            .replace(" | None", " or null"))
    return re.sub(r"\b(str|int|float|bool|ServerTls|UpstreamTls|UpstreamAuth)\b", lambda m: _TYPE_WORDS[m[1]], text)


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    if dataclasses.is_dataclass(value):
        return str(value) if type(value).__name__ == "HostPort" else "(section)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | tuple) and not value:
        return "{}" if isinstance(value, dict) else "[]"
    return f"{value}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# Meanings for the fields whose definition carries no comment yet (facts from the concept pages). When the
# configuration becomes a schema, these move into its field descriptions and this table goes.
_MEANINGS = {
    "upstream": "required: the bootstrap host:port list of the real cluster (a sidecar: exactly one broker)",
    "admin": "the admin HTTP listener: /metrics, /livez, /readyz",
    "tls": "terminate TLS from clients at the proxy's listeners (section below)",
    "upstream_tls": "originate TLS or mTLS to the brokers (section below)",
    "api_max_versions": "cap the versions offered to clients: a mapping of API key to its highest version",
    "metadata_refresh_s": "how often the proxy refreshes its own cluster metadata",
    "ready_max_metadata_age_s": "/readyz fails when the last successful own Metadata request is older than this",
    "tls.certfile": "the listener's certificate (PEM); must be a readable file",
    "tls.keyfile": "its private key (PEM); must be a readable file",
    "tls.require_client_cert": "admit only clients with a certificate signed by cafile",
    "upstream_tls.cafile": "CA bundle to verify the brokers (default: the system's)",
    "upstream_tls.certfile": "client certificate for mTLS to the brokers",
    "upstream_tls.keyfile": "its private key",
    "upstream_tls.check_hostname": "verify the broker's host name against its certificate",
    "upstream_auth.username": "required: the proxy's own principal, User:<username>",
    "upstream_auth.password": "exactly one of password and password_file; taken as written from the environment",
    "limits.max_frame_bytes": "largest frame accepted either way (100 MiB)",
    "limits.pre_auth_max_frame_bytes": "largest frame before SASL completes when client_auth is sasl (512 KiB)",
    "limits.max_connections": "client connections at most",
    "limits.partial_frame_timeout_s": "a frame started and not finished within this closes the connection",
    "limits.connect_timeout_s": "bound on connecting to a broker",
    "limits.low_water_bytes": "resume reading below this write buffer (not above high_water_bytes)",
    "limits.drain_timeout_s": "on SIGTERM, connections still busy after this are closed (drain_deadline)",
    "verification.enabled": "verify transactional Produce and TxnOffsetCommit (KIP-890 part 1)",
    "verification.registry_max_entries": "transactional ids the registry keeps at most",
    "verification.registry_idle_expiry_s": "a transactional id unseen for this long leaves the registry",
    "verification.hold_max_ms": "a held check never waits longer than this",
    "verification.client_request_timeout_ms": "TxnOffsetCommit carries no timeout: the hold uses the TimeoutMs of the "
                                              "id's last Produce, else this (clients' default is 30 s)",
    "verification.end_txn_in_doubt_max_ms": "how long an unanswered EndTxn is held for, and how long the broker "
                                            "connection a client left stays open for its answer",
}


def _rows(config: Any, cls: type, prefix: str) -> Iterator[str]:
    comments = _field_comments(cls)
    hints = typing.get_type_hints(cls, vars(config))
    extra = {  # choices the code keeps as module constants rather than in a comment
        "coordinator_evidence": f"one of {', '.join(config.COORDINATOR_EVIDENCE)}",
        "mechanism": f"one of {', '.join(config.SASL_MECHANISMS)}",
        "log_level": "one of debug, info, warning, error",
    }
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        sub = hints.get(f.name)
        if dataclasses.is_dataclass(sub) and sub is not config.HostPort:
            continue  # a section: its own table
        meaning = comments.get(f.name) or _MEANINGS.get(key, "")
        if f.name in extra:
            meaning = f"{meaning}; {extra[f.name]}" if meaning else extra[f.name]
        env = "TXNGUARD_" + key.upper().replace(".", "__")
        yield (f"| `{key}` | {_cell(_type_name(f.type))} | `{_cell(_default(f))}` | {_cell(meaning)} | "
               f"`{env}` |")


def _sections(config: Any) -> list[tuple[str, str, type]]:
    """(title, key prefix, dataclass) for the top level and each section, in the order of the top level."""
    out: list[tuple[str, str, type]] = [("Top level", "", config.ProxyConfig)]
    hints = typing.get_type_hints(config.ProxyConfig, vars(config))
    for f in dataclasses.fields(config.ProxyConfig):
        tp = hints[f.name]
        inner = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)] or [tp]
        cls = inner[0]
        if dataclasses.is_dataclass(cls) and cls is not config.HostPort:
            out.append((f"`{f.name}:`", f"{f.name}.", cls))
    return out


def render() -> str:
    config, policy = _import_config()
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by docs/gen_config_reference.py from src/txnguard/proxy/config.py at build time: "
        "edit the code's comments, not this page. -->",
        "",
        "The proxy reads its settings from a YAML file (`txnguard run --config FILE`), then `TXNGUARD_*`",
        "environment variables, then command-line flags; each later source overrides the earlier one.",
        "An environment variable names a nested key with `__` (`TXNGUARD_LIMITS__MAX_IN_FLIGHT=100`) and its",
        "value is read as a YAML scalar, so numbers and booleans keep their types (a `password` is taken as",
        "written). `txnguard check-config FILE` loads a file the way `run` does and prints the first error,",
        "which names the key and the value (`limits.max_in_flight: -3 is not a positive integer`).",
        "Booleans are spelt `true`/`false` (YAML 1.2): `on`, `off`, `yes` and `no` are strings.",
        "",
        "Each table lists a section's keys with their type, default, meaning and environment variable.",
        "Annotated examples: [the gateway](#example-gateway) and [the sidecar](#example-sidecar) below.",
        "",
    ]
    for title, prefix, cls in _sections(config):
        lines += [f"## {title}", ""]
        doc = inspect.getdoc(cls)
        if doc and not doc.startswith(cls.__name__ + "("):
            lines += [doc, ""]
        lines += ["| key | type | default | meaning | environment |", "| --- | --- | --- | --- | --- |"]
        lines += list(_rows(config, cls, prefix))
        lines.append("")
    doc = inspect.getdoc(policy.policy_from_config) or ""
    example = doc.split("\n\n", 1)[1] if "\n\n" in doc else doc
    lines += [
        "## `policy:`",
        "",
        "Enforcement and error mapping (`txnguard.policies.policy`); `kill -HUP` re-reads it without dropping",
        "connections. Its shape, with every key:",
        "",
        "```yaml",
        inspect.cleandoc(example),
        "```",
        "",
        "Modes: `enforce` (reject), `monitor` (decide, log, count and audit, but forward), `off`. Outcomes for",
        f"`errors`: {', '.join(f'`{o}`' for o in sorted(policy._OUTCOMES))}.",
        "See [transaction verification](../concepts/verification.md#errors) for the default error of each",
        "outcome and [coordinator-side timeouts](../concepts/timeout-recovery.md) for `timeout_recovery`.",
        "",
        "## Example: gateway {#example-gateway}",
        "",
        "`deploy/gateway.yaml`:",
        "",
        "```yaml",
        (ROOT / "deploy" / "gateway.yaml").read_text().rstrip(),
        "```",
        "",
        "## Example: sidecar {#example-sidecar}",
        "",
        "`deploy/sidecar/sidecar.yaml`:",
        "",
        "```yaml",
        (ROOT / "deploy" / "sidecar" / "sidecar.yaml").read_text().rstrip(),
        "```",
        "",
    ]
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs hook: the page's file in the repository is a stub; the site gets the generated page."""
    if page.file.src_uri == PAGE:
        return render()
    return markdown


if __name__ == "__main__":
    print(render())

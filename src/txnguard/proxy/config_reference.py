"""What is made from the configuration's JSON Schema: the files that ship it, the Markdown reference, and
`check-config --show`'s listing of the effective configuration with where each value came from.

    txnguard config-schema              the JSON Schema (deploy/schema/txnguard.schema.json holds a copy)
    txnguard config-schema --markdown   the configuration reference (docs/reference/configuration.md)
    txnguard config-schema --write      rewrite the shipped copies: the schema file and the Helm chart's
                                        values.schema.json (its `config:` and its $defs)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from txnguard.proxy import config

ROOT = Path(__file__).resolve().parents[3]
SCHEMA_FILE = Path("deploy/schema/txnguard.schema.json")
HELM_VALUES_SCHEMA = Path("deploy/helm/txnguard/values.schema.json")
MASK = "**********"


def schema_text() -> str:
    return json.dumps(config.schema(), indent=2) + "\n"


# -- the Helm chart ---------------------------------------------------------------------------------------------


def helm_values_schema(chart: Mapping[str, Any]) -> dict[str, Any]:
    """The chart's values.schema.json with `config:` described by the configuration's schema: its root
    becomes $defs.TxnguardConfig, its $defs join the chart's (Helm checks values, not files, so the schema
    is carried inside the chart rather than referred to)."""
    txnguard = config.schema()
    root = {k: v for k, v in txnguard.items() if k not in ("$schema", "$defs")}
    defs = {**{k: v for k, v in chart.get("$defs", {}).items() if k not in txnguard["$defs"]},
            **txnguard["$defs"], "TxnguardConfig": root}
    properties = {**chart.get("properties", {}), "config": {
        "$ref": "#/$defs/TxnguardConfig",
        "description": "txnguard settings merged into the generated txnguard.yaml (the shape sets mode, listen, "
                       "upstream and admin)"}}
    return {**chart, "properties": properties, "$defs": dict(sorted(defs.items()))}


def write(root: Path = ROOT) -> list[Path]:
    """Rewrite the shipped copies of the schema; returns the files written."""
    (root / SCHEMA_FILE).parent.mkdir(parents=True, exist_ok=True)
    (root / SCHEMA_FILE).write_text(schema_text())
    chart = json.loads((root / HELM_VALUES_SCHEMA).read_text())
    (root / HELM_VALUES_SCHEMA).write_text(json.dumps(helm_values_schema(chart), indent=2) + "\n")
    return [root / SCHEMA_FILE, root / HELM_VALUES_SCHEMA]


# -- the Markdown reference -------------------------------------------------------------------------------------


def _resolve(node: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    while "$ref" in node:
        node = defs[node["$ref"].rsplit("/", 1)[1]]
    return node


def _options(node: Mapping[str, Any], defs: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    node = _resolve(node, defs)
    if "anyOf" in node:
        return [o for branch in node["anyOf"] for o in _options(branch, defs)]
    return [node]


def _section(node: Mapping[str, Any], defs: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """("", model) for a section, ("[]", model) for a list of them, else None."""
    for o in _options(node, defs):
        if "properties" in o:
            return "", o
        items = o.get("items")
        if isinstance(items, Mapping) and "properties" in _resolve(items, defs):
            return "[]", _resolve(items, defs)
    return None


def _bounds(o: Mapping[str, Any]) -> str:
    parts = []
    if "exclusiveMinimum" in o:
        parts.append(f"> {o['exclusiveMinimum']:g}")
    if "minimum" in o:
        parts.append(f">= {o['minimum']:g}")
    if "maximum" in o:
        parts.append(f"<= {o['maximum']:g}")
    return f" {', '.join(parts)}" if parts else ""


def _map_type(o: Mapping[str, Any], defs: Mapping[str, Any], anchor: str) -> str:
    values = o.get("additionalProperties")
    names = _resolve(o.get("propertyNames", {}), defs)
    keys = "integer" if names.get("pattern") == "^[0-9]+$" else \
        f"({' | '.join(f'`{v}`' for v in names['enum'])})" if "enum" in names else "name"
    return f"map of {keys} to {_type(values, defs, anchor)}" if isinstance(values, Mapping) else "map"


def _word(o: Mapping[str, Any], defs: Mapping[str, Any], anchor: str) -> str:
    kind = o.get("type")
    if "enum" in o:
        return " | ".join(f"`{v}`" for v in o["enum"])
    if "properties" in o:
        return f"section ([below](#{anchor}))"
    if kind == "array":
        inner = _resolve(o.get("items", {}), defs)
        return f"list of sections ([below](#{anchor}))" if "properties" in inner else \
            f"list of {_type(inner, defs, anchor)}"
    if kind == "object":
        return _map_type(o, defs, anchor)
    if kind == "string" and "pattern" in o:
        return "host:port" if o["pattern"] == config.HOST_PORT_SCHEMA["pattern"] else "host:port[,host:port...]"
    if kind == "string":
        return "secret string" if o.get("writeOnly") else "string"
    if kind in ("integer", "number", "boolean"):
        return f"{kind}{_bounds(o)}"
    if isinstance(kind, list):
        return " or ".join(kind)
    return str(kind or "any")


def _type(node: Mapping[str, Any], defs: Mapping[str, Any], anchor: str) -> str:
    return " or ".join(dict.fromkeys(_word(o, defs, anchor) for o in _options(node, defs))) or "any"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _default(node: Mapping[str, Any], required: bool) -> str:
    if required:
        return "required"
    if "default" not in node:
        return ""
    value = node["default"]
    if isinstance(value, dict) and value:
        return "see below"
    return f"`{json.dumps(value)}`"


def _table(path: str, model: Mapping[str, Any], defs: Mapping[str, Any], env: bool,
           later: list[tuple[str, Mapping[str, Any], bool]]) -> list[str]:
    lines = ["| Setting | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for name, node in model.get("properties", {}).items():
        key = f"{path}.{name}" if path else name
        section = _section(node, defs)
        anchor = (key + (section[0] if section else "")).replace(".", "").replace("[]", "")
        description = node.get("description") or (section[1] if section else _resolve(node, defs)).get(
            "description", "")
        if env and not section:
            description += f" Environment: `{config.ENV_PREFIX}{key.replace('.', '__').upper()}`."
        required = name in model.get("required", [])
        lines.append(f"| `{key}` | {_cell(_type(node, defs, anchor))} | {_cell(_default(node, required))} | "
                     f"{_cell(description)} |")
        if section:
            later.append((key + section[0], section[1], env and not section[0]))
    return lines


def markdown(schema: Mapping[str, Any] | None = None) -> str:
    """The configuration reference, every setting with its type, constraints, default and description."""
    schema = schema or config.schema()
    defs = schema.get("$defs", {})
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated from the configuration's JSON Schema by `txnguard config-schema --markdown`: "
        "edit the models in src/txnguard/proxy/config.py, not this page. -->",
        "",
        _cell(schema.get("description", "")),
        "",
        "Settings are read from the YAML file given with `--config`, then from `TXNGUARD_*` environment "
        "variables (levels joined by `__`: `TXNGUARD_LIMITS__MAX_IN_FLIGHT=50`; values read as YAML scalars, a "
        "password as written), then from command-line flags (`--upstream`, `--listen`, `--mode`, `--admin`, "
        "`--advertised-host`, `--log-level`). `txnguard check-config FILE --show` prints the effective "
        "configuration and where each value came from, secrets masked.",
        "",
        f"Editors can validate `txnguard.yaml` with the JSON Schema `{SCHEMA_FILE}` (for example with a "
        f"`# yaml-language-server: $schema=...` first line); `txnguard config-schema` prints it. A few rules "
        "are checked at load time only, not by the schema: files named by `*file` settings must be readable; "
        "`upstream` is required (sidecar: exactly one); `upstream_auth` takes exactly one of `password` and "
        "`password_file`; `limits.low_water_bytes` <= `limits.high_water_bytes` and "
        "`limits.pre_auth_max_frame_bytes` <= `limits.max_frame_bytes`; `audit_path` and `audit.path` must "
        "agree.",
        "",
        "## Top-level settings",
        "",
    ]
    later: list[tuple[str, Mapping[str, Any], bool]] = []
    out += _table("", schema, defs, True, later)
    while later:
        path, model, env = later.pop(0)
        out += ["", f"## `{path}`", ""]
        if model.get("description"):
            out += [_cell(model["description"]), ""]
        nested: list[tuple[str, Mapping[str, Any], bool]] = []
        out += _table(path, model, defs, env, nested)
        later = nested + later
    return "\n".join(out) + "\n"


# -- the effective configuration --------------------------------------------------------------------------------

_MAPS = ("producer", "errors", "broker_ports", "api_max_versions")


def _flat(node: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    out: dict[tuple[str, ...], Any] = {}
    for k, v in node.items():
        if isinstance(v, Mapping) and k not in _MAPS:
            out.update(_flat(v, (*prefix, k)))
        else:
            out[(*prefix, k)] = v
    return out


def _masked(key: tuple[str, ...], value: Any) -> Any:
    if key[-1] == "producer" and isinstance(value, Mapping):
        return {k: MASK if config.SECRET_SETTING.search(k) else v for k, v in value.items()}
    if config.SECRET_SETTING.search(key[-1]) and not key[-1].endswith("_file") and value is not None:
        return MASK
    return value


def effective(loaded: config.Loaded) -> list[tuple[str, Any, str]]:
    """(setting, value, origin) for every setting, secrets masked; origin: `default`, `file PATH`,
    `environment TXNGUARD_...` or `flag --name`."""
    rows = []
    for key, value in _flat(loaded.config.model_dump(mode="json")).items():
        given = [k for k in loaded.origins if key[:len(k)] == k or k[:len(key)] == key]
        origin = " ".join(loaded.origins[max(given, key=len)]) if given else config.DEFAULT
        rows.append((".".join(key), _masked(key, value), origin))
    return rows


def effective_text(loaded: config.Loaded) -> str:
    rows = [(k, json.dumps(v), o) for k, v, o in effective(loaded)]
    width = min(max(len(k) + len(v) for k, v, _ in rows) + 3, 64)
    return "".join(f"{f'{k}: {v}':<{width}}# {o}\n" for k, v, o in rows)

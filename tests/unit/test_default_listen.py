"""The default `listen`, and the broker ports a gateway derives from it, collide with no shipped layout.

A proxy started with the defaults beside a broker laid out as the repository ships it (the sidecar
configs, whose broker moves its client listener to 127.0.0.1:9192; the chart's ports; `make run`'s
ports) must not fail to bind, nor take a port one of them needs.

    every shipped config / the chart's values / the sidecar README's listeners / the Makefile
        ─▶ every port they name
    ProxyConfig() defaults ─▶ listen's port + each default broker port (node ids 0-99)
        ─▶ no port in both
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from txnguard.proxy import config

ROOT = Path(__file__).resolve().parents[2]
PORT = re.compile(r":(\d{2,5})\b")


def _ports_in(value: object) -> set[int]:
    if isinstance(value, dict):
        return {p for v in value.values() for p in _ports_in(v)}
    if isinstance(value, list):
        return {p for v in value for p in _ports_in(v)}
    if isinstance(value, str):
        return {int(p) for p in PORT.findall(value)}
    return set()


def shipped_ports() -> dict[int, str]:
    used: dict[int, str] = {}
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        if "templates" in path.parts or path.name == "values.yaml":
            continue
        for port in _ports_in(yaml.safe_load(path.read_text())):
            used.setdefault(port, str(path.relative_to(ROOT)))
    values = yaml.safe_load((ROOT / "deploy" / "helm" / "txnguard" / "values.yaml").read_text())
    chart = [values["adminPort"], values["gateway"]["port"],
             *(values["gateway"]["brokerPortBase"] + n for n in values["gateway"]["brokerIds"]),
             *(v for k, v in values["sidecar"].items() if k.endswith("Port"))]
    for port in chart:
        used.setdefault(port, "deploy/helm/txnguard/values.yaml")
    readme = (ROOT / "deploy" / "sidecar" / "README.md").read_text()
    for line in readme.splitlines():
        if line.startswith("listeners="):
            for port in _ports_in(line):
                used.setdefault(port, "deploy/sidecar/README.md")
    for line in (ROOT / "Makefile").read_text().splitlines():
        if "txnguard dev" in line:
            for port in _ports_in(line):
                used.setdefault(port, "Makefile (make run)")
    return used


def test_the_shipped_layouts_are_read():
    used = shipped_ports()
    # The sidecar layouts' loopback broker listener, the chart's admin port, make run's bootstrap.
    assert {9092, 9192, 9404, 19092} <= used.keys()


def test_the_default_listen_and_its_broker_ports_collide_with_no_shipped_layout():
    defaults = config.from_mapping({"upstream": "broker-1:9092"})  # every other setting its default
    mine = {defaults.listen.port} | {defaults.broker_port(node_id) for node_id in range(100)}
    used = shipped_ports()
    assert {port: used[port] for port in sorted(mine & used.keys())} == {}
    assert str(defaults.listen) == "127.0.0.1:9292"

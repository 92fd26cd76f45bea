"""The harness half of the `txnguard` command line: `txnguard kafka ...`, `txnguard dev` and `txnguard demo`.

`txnguard.cli` hands these subcommands over by name (importlib), so `txnguard run`
never loads the test harness.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from txnguard.testing import jars, kafka


def _kafka_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    k = sub.add_parser("kafka", help="start and stop real Kafka clusters for tests and demos")
    ks = k.add_subparsers(dest="action", required=True)
    up = ks.add_parser("up", help="start an N-node KRaft (or --zookeeper) cluster and print its bootstrap "
                                   "address as JSON")
    up.add_argument("--version", default="3.5.2", help="Kafka version (default 3.5.2)")
    up.add_argument("--nodes", type=int, default=1, help="brokers (KRaft: combined broker and controller; default 1)")
    up.add_argument("--dir", required=True, help="where the nodes' configuration, data and logs go")
    up.add_argument("--zookeeper", action="store_true",
                    help="ZooKeeper mode (Kafka 2.8-3.9): a ZooKeeper server, then brokers with zookeeper.connect")
    up.add_argument("--sidecars", action="store_true",
                    help="brokers advertise a sidecar port per node (where a txnguard sidecar is to listen)")
    up.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                    help="a broker setting, repeatable")
    up.add_argument("--timeout", type=float, default=kafka.READY_TIMEOUT_S,
                    help=f"seconds to wait for every node to be ready (default {kafka.READY_TIMEOUT_S:g})")
    for name, text in (("down", "stop every node (SIGTERM, then SIGKILL)"), ("status", "show the nodes")):
        p = ks.add_parser(name, help=text)
        p.add_argument("--dir", required=True, help="the cluster's folder (kafka up --dir)")
    ks.add_parser("fetch", help="resolve every Kafka and tool jar the tests use into the cache")
    run = ks.add_parser("run", help="start a cluster in the foreground; Ctrl-C stops it")
    run.add_argument("--version", default="3.5.2", help="Kafka version (default 3.5.2)")
    run.add_argument("--nodes", type=int, default=1, help="brokers (default 1)")
    run.add_argument("--dir", default=".run/kafka", help="where the nodes go (default .run/kafka)")
    run.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                     help="a broker setting, repeatable")
    run.add_argument("--zookeeper", action="store_true", help="ZooKeeper mode (Kafka 2.8-3.9)")


def _dev_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev = sub.add_parser("dev", help="a local real Kafka with txnguard in front of it, for trying clients")
    dev.add_argument("--version", default="3.5.2", help="Kafka version (default 3.5.2: no KIP-890 in the broker)")
    dev.add_argument("--nodes", type=int, default=1, help="brokers (default 1)")
    dev.add_argument("--dir", default=".run/kafka", help="where Kafka's nodes go (default .run/kafka)")
    dev.add_argument("--zookeeper", action="store_true", help="ZooKeeper mode (Kafka 2.8-3.9)")
    dev.add_argument("--listen", default="127.0.0.1:19092",
                     help="the proxy's bootstrap listener (default 127.0.0.1:19092)")
    dev.add_argument("--admin", default="127.0.0.1:19000",
                     help="the proxy's admin endpoint: /metrics, /livez, /readyz (default 127.0.0.1:19000)")
    dev.add_argument("--audit", default=".run/audit.jsonl",
                     help="the proxy's audit records, JSON lines (default .run/audit.jsonl)")


def _demo_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser("demo", help="show, on a real Kafka, the hanging transaction txnguard prevents (~1 min)")
    demo.add_argument("--version", default="3.5.2", help="Kafka version (default 3.5.2: no KIP-890 in the broker)")
    demo.add_argument("--records", type=int, default=3, help="records the well-behaved producer commits")
    demo.add_argument("--watch-seconds", type=float, default=5.0,
                      help="how long the read_committed consumer is watched on the direct path")
    demo.add_argument("--temp-dir", help="where the demo's temporary folder is made (removed at the end)")


def _dev(args: argparse.Namespace) -> int:
    """`make run`: start Kafka, then the proxy in the foreground; Ctrl-C stops both."""
    from pathlib import Path

    from txnguard.proxy import config
    from txnguard.proxy.main import run

    cluster = kafka.up(args.version, args.nodes, args.dir, zookeeper=args.zookeeper)
    try:
        Path(args.audit).parent.mkdir(parents=True, exist_ok=True)
        cfg = config.load(None, {"upstream": cluster.bootstrap_servers, "listen": args.listen,
                                 "admin": args.admin, "audit_path": args.audit})
        print(f"Kafka {cluster.version} is up at {cluster.bootstrap_servers} (direct).", flush=True)
        print(f"Use bootstrap.servers={cfg.listen} to go through txnguard "
              f"(metrics: http://{cfg.admin}/metrics, audit log: {args.audit}). Ctrl-C stops both.", flush=True)
        run(cfg, log_render="auto")  # a person at a terminal reads these lines
    finally:
        cluster.down()
        print("Kafka stopped.", flush=True)
    return 0


def _run_kafka(args: argparse.Namespace) -> int:
    if args.action == "up":
        cluster = kafka.up(args.version, args.nodes, args.dir, kafka.parse_config(args.config), args.timeout,
                           sidecars=args.sidecars, zookeeper=args.zookeeper)
        print(json.dumps(cluster.summary()), flush=True)
    elif args.action == "down":
        kafka.down(args.dir)
    elif args.action == "status":
        print(json.dumps(kafka.Cluster.load(args.dir).status()))
    elif args.action == "run":
        cluster = kafka.up(args.version, args.nodes, args.dir, kafka.parse_config(args.config),
                           zookeeper=args.zookeeper)
        try:
            print(f"Kafka {cluster.version} is up. bootstrap.servers={cluster.bootstrap_servers}", flush=True)
            print("Press Ctrl-C to stop.", flush=True)
            _wait_for_signal()
        finally:
            cluster.down()
            print("Kafka stopped.", flush=True)
    elif args.action == "fetch":
        for folder in jars.resolve_all():
            print(folder)
    return 0


def _wait_for_signal() -> None:
    import signal

    stop = {"now": False}

    def handler(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    while not stop["now"]:
        signal.pause()


def build_parser() -> argparse.ArgumentParser:
    """The harness's subcommands (`txnguard.cli.main` hands them over by name)."""
    parser = argparse.ArgumentParser(prog="txnguard")
    sub = parser.add_subparsers(dest="command", required=True)
    _kafka_parser(sub)
    _dev_parser(sub)
    _demo_parser(sub)
    return parser


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    from txnguard.proxy.config import ConfigError

    try:
        if args.command == "kafka":
            return _run_kafka(args)
        if args.command == "demo":
            from txnguard.testing import demo

            return demo.main(args.version, args.records, args.watch_seconds, args.temp_dir)
        return _dev(args)
    except ConfigError as e:
        print(f"txnguard: configuration error: {e}", file=sys.stderr)
        return 2
    except (kafka.HarnessError, jars.JarResolutionError, OSError) as e:
        print(f"txnguard: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

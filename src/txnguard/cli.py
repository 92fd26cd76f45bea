"""`txnguard` command line.

* `txnguard run --config FILE [--upstream ...] [--listen ...] [--mode ...] [--admin ...]`: the proxy.
* `txnguard check-config FILE`: validate a configuration and print it resolved.
* `txnguard hanging --bootstrap HOST:PORT|--config FILE [--topic T [--partition P]] [--broker-id N] [--abort ...]`: find
  hanging transactions as `kafka-transactions.sh find-hanging` does, and abort them (proxy/hanging.py).
* `txnguard kafka up|down|status|run|fetch` and `txnguard dev`: real Kafka clusters for tests and demos.
* `txnguard demo`: on a real Kafka 3.5.2, the hanging transaction txnguard prevents, direct and proxied.

The last three live with the test harness (`txnguard.testing.cli`) and are loaded by name only
when asked for: the proxy's own commands never import the harness (an import contract says so
for static imports, and tests/unit/test_cli_imports.py checks it at run time).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

HARNESS_COMMANDS = {
    "kafka": "start and stop real Kafka clusters for tests and demos",
    "dev": "a local real Kafka with txnguard in front of it, for trying clients",
    "demo": "on a real Kafka, the hanging transaction txnguard prevents, direct and proxied (~1 min)",
}


def _proxy_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="run the proxy")
    run.add_argument("--config", help="YAML configuration file")
    run.add_argument("--upstream", help="bootstrap host:port[,host:port...] of the real cluster")
    run.add_argument("--listen", help="host:port of the bootstrap listener")
    run.add_argument("--mode", choices=("gateway", "sidecar"))
    run.add_argument("--admin", help="host:port of the admin HTTP endpoint (/metrics, /livez, /readyz)")
    run.add_argument("--advertised-host", help="host name clients should use for the proxy's listeners")
    run.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    check = sub.add_parser("check-config", help="validate a configuration file")
    check.add_argument("config")
    from txnguard.proxy import hanging

    hanging.add_parser(sub)


def _proxy_config(args: argparse.Namespace) -> Any:
    from txnguard.proxy import config

    overrides = {
        "upstream": args.upstream, "listen": args.listen, "mode": args.mode, "admin": args.admin,
        "advertised_host": args.advertised_host, "log_level": args.log_level,
    }
    return config.load(args.config, overrides)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in HARNESS_COMMANDS:
        harness = importlib.import_module("txnguard.testing.cli")
        return int(harness.main(argv))
    parser = argparse.ArgumentParser(prog="txnguard")
    sub = parser.add_subparsers(dest="command", required=True)
    _proxy_parsers(sub)
    from txnguard.pipeline import options as report_options  # argparse only: pyspark loads in run()
    report_options.add_parser(sub)
    args = parser.parse_args(argv)
    from txnguard.proxy.config import ConfigError

    try:
        if args.command == "report":  # the fleet pipeline (PySpark)
            return report_options.run(args)
        if args.command == "hanging":
            from txnguard.proxy import hanging

            return hanging.run_cli(args)
        if args.command == "check-config":
            from txnguard.proxy import config

            cfg = config.load(args.config)
            print(f"{args.config}: ok ({cfg.mode} mode, listen {cfg.listen}, "
                  f"upstream {','.join(str(u) for u in cfg.upstream)})")
            return 0
        if args.command == "run":
            from txnguard.proxy.main import run

            run(_proxy_config(args), args.config)
            return 0
    except ConfigError as e:
        print(f"txnguard: configuration error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"txnguard: {e}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())

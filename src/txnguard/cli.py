"""`txnguard` command line.

* `txnguard run --config FILE [--upstream ...] [--listen ...] [--mode ...] [--admin ...]`: the proxy.
* `txnguard check-config [FILE] [--show] [flags]`: validate a configuration; `--show` prints every setting's
  effective value and where it came from (file, environment, flag, default), secrets masked.
* `txnguard config-schema [--markdown | --write]`: the configuration's JSON Schema, or its Markdown reference.
* `txnguard hanging --bootstrap HOST:PORT|--config FILE [--topic T [--partition P]] [--broker-id N] [--abort ...]`: find
  hanging transactions as `kafka-transactions.sh find-hanging` does, and abort them (proxy/hanging_cli.py).
* `txnguard kafka up|down|status|run|fetch` and `txnguard dev`: real Kafka clusters for tests and demos.
* `txnguard demo`: on a real Kafka 3.5.2, the hanging transaction txnguard prevents, direct and proxied.
* `txnguard --version`: the installed package's version (pyproject.toml's, through the package metadata).

`txnguard --help` lists every subcommand. The last three live with the test harness (`txnguard.testing.harness_cli`) and
are loaded by name only when asked for: the proxy's own commands never import the harness (an import contract says so
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


def _setting_flags(parser: argparse.ArgumentParser) -> None:
    """The settings a flag can give (over the file and the TXNGUARD_* environment)."""
    parser.add_argument("--upstream", help="bootstrap host:port[,host:port...] of the real cluster")
    parser.add_argument("--listen", help="host:port of the bootstrap listener")
    parser.add_argument("--mode", choices=("gateway", "sidecar"))
    parser.add_argument("--admin", help="host:port of the admin HTTP endpoint (/metrics, /livez, /readyz)")
    parser.add_argument("--advertised-host", help="host name clients should use for the proxy's listeners")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"))


def _proxy_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="run the proxy", description=(
        "Run the proxy in the foreground until SIGTERM or SIGINT (then drain: limits.drain_timeout_s); SIGHUP "
        "re-reads the policy. Settings: --config, then TXNGUARD_* environment variables, then these flags. Exit "
        "0 after a clean stop, 2 on a configuration error, 1 when a listener cannot be opened."))
    run.add_argument("--config", help="YAML configuration file")
    _setting_flags(run)
    check = sub.add_parser("check-config", help="validate a configuration (file, TXNGUARD_* environment, flags)",
                           description=(
        "Validate a configuration as `txnguard run` would load it (the file, then TXNGUARD_* environment variables, "
        "then the flags), without starting anything. Exit 0 and one line (mode, listen, upstream) when it is "
        "valid; exit 2 and every error on stderr, one per line, naming the setting and the value, when it is not."))
    check.add_argument("config", nargs="?", help="YAML configuration file (none: environment and flags only)")
    check.add_argument("--show", action="store_true",
                       help="print the effective configuration and where each value came from (secrets masked)")
    _setting_flags(check)
    schema = sub.add_parser("config-schema", help="print the configuration's JSON Schema")
    schema.add_argument("--markdown", action="store_true", help="print the configuration reference instead")
    schema.add_argument("--write", action="store_true",
                        help="rewrite the shipped copies (deploy/schema/, the Helm chart's values.schema.json)")
    from txnguard.proxy import hanging_cli

    hanging_cli.add_parser(sub)


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    return {"upstream": args.upstream, "listen": args.listen, "mode": args.mode, "admin": args.admin,
            "advertised_host": args.advertised_host, "log_level": args.log_level}


def _proxy_config(args: argparse.Namespace) -> Any:
    from txnguard.proxy import config

    return config.load(args.config, _flags(args))


def _check_config(args: argparse.Namespace) -> int:
    from txnguard.proxy import config, config_reference

    loaded = config.load_with_origins(args.config, _flags(args))
    cfg = loaded.config
    print(f"{args.config or 'environment and flags'}: ok ({cfg.mode} mode, listen {cfg.listen}, "
          f"upstream {','.join(str(u) for u in cfg.upstream)})")
    if args.show:
        print(config_reference.effective_text(loaded), end="")
    return 0


def _config_schema(args: argparse.Namespace) -> int:
    from txnguard.proxy import config_reference

    if args.write:
        for path in config_reference.write():
            print(f"wrote {path}")
    elif args.markdown:
        print(config_reference.markdown(), end="")
    else:
        print(config_reference.schema_text(), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """`txnguard` and its subcommands. The harness's (HARNESS_COMMANDS) are listed by name and help only:
    `main` hands them to `txnguard.testing.harness_cli` before parsing, whose parsers define their options."""
    import txnguard

    parser = argparse.ArgumentParser(prog="txnguard")
    parser.add_argument("--version", action="version", version=f"txnguard {txnguard.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _proxy_parsers(sub)
    from txnguard.pipeline import options as report_options  # argparse only: pyspark loads in run()
    report_options.add_parser(sub)
    for name, text in HARNESS_COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in HARNESS_COMMANDS:
        harness = importlib.import_module("txnguard.testing.harness_cli")
        return int(harness.main(argv))
    args = build_parser().parse_args(argv)
    from txnguard.pipeline import options as report_options
    from txnguard.proxy.config import ConfigError

    try:
        if args.command == "report":  # the fleet pipeline (PySpark)
            return report_options.run(args)
        if args.command == "hanging":
            from txnguard.proxy import hanging_cli

            return hanging_cli.run_cli(args)
        if args.command == "check-config":
            return _check_config(args)
        if args.command == "config-schema":
            return _config_schema(args)
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

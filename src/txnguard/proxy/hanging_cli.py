"""`txnguard hanging`: find hanging transactions in any cluster (through a txnguard proxy or not) and abort
them on request. The scan and the abort are proxy/hanging_io.py's; this module is the command line around them
(arguments, the tool's table or JSON, the confirmation before an abort). It needs neither the proxy's
server nor its monitor: with `--config` it dials the brokers with the proxy's own TLS (proxy/tls.py) and
SASL settings.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any, NamedTuple

from txnguard.codecs.errors import CodecError
from txnguard.codecs.transaction_log import TOPIC as TRANSACTION_LOG
from txnguard.proxy import hanging_io
from txnguard.proxy.config import ConfigError, HostPort, load, parse_host_port
from txnguard.proxy.kafka_client import UpstreamError
from txnguard.proxy.tls import upstream_ssl_context
from txnguard.verification.hanging import Finding, MaxTimeout, OwnTimeout, Rule, table

# Named so that nobody types it by habit: it aborts what no coordinator confirmed.
UNCONFIRMED_FLAG = "--abort-unconfirmed-i-checked"
MAY_BE_LIVE = ("no coordinator was asked and its age is only its producer's last timestamp: a producer writing "
               "event-time timestamps (Kafka Streams, MirrorMaker), a producer clock behind, a transaction timeout "
               "above the threshold or a lagging replica all look the same")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "hanging", help="find hanging transactions (as kafka-transactions.sh find-hanging) and optionally abort them",
        description="Find partitions whose last stable offset is held by a transaction the coordinator will never "
                    "finish, judged as kafka-transactions.sh find-hanging, after each transaction's own timeout (or "
                    "exactly as the tool with --max-transaction-timeout). Works against any cluster, "
                    "through a txnguard proxy or not. With neither --topic nor --broker-id every topic (internal ones "
                    "too) is searched. Each partition is asked of its leader only (a follower that lags shows "
                    "committed transactions as open). On Kafka < 3.0 (no ListTransactions) the coordinator's own log, "
                    "__transaction_state, is read to its end instead (DESCRIBE and READ on it). Findings no "
                    "coordinator or log could confirm are never aborted by --abort --yes; see "
                    "--abort-unconfirmed-i-checked.")
    p.add_argument("--bootstrap", help="host:port[,host:port...] of the cluster (or of a proxy); default: the "
                                       "upstream of --config")
    p.add_argument("--config", help="a txnguard proxy config: its upstream, upstream_tls and upstream_auth (SASL "
                                    "SCRAM) are used, so the scan runs as the proxy's own principal, as the proxy's "
                                    "periodic scan does (TXNGUARD_* environment overrides apply, e.g. the password)")
    p.add_argument("--topic", help="search this topic only")
    p.add_argument("--partition", type=int, help="and this partition only (needs --topic)")
    p.add_argument("--broker-id", type=int, help="search the partitions with a replica on this broker (each asked of "
                                                 "its leader, unlike find-hanging, which asks this broker)")
    p.add_argument("--max-transaction-timeout", type=int, metavar="MINUTES",
                   help="find-hanging's rule exactly: open transactions whose producer last wrote longer ago than "
                        "this are candidates (the tool's default is 15; keep it at least the cluster's "
                        "transaction.max.timeout.ms). Without it: an open transaction hangs once its coordinator "
                        "no longer lists the partition and the producer's last write there is older than that "
                        "transaction's own timeout plus --timeout-margin, confirmed by a second DescribeProducers "
                        "(the cluster's transaction.max.timeout.ms when the coordinator cannot describe it)")
    p.add_argument("--timeout-margin", type=float, default=10.0, metavar="SECONDS",
                   help="added to each transaction's own timeout when --max-transaction-timeout is not given "
                        "(default 10: the coordinator looks for timed-out transactions every 10 s by default)")
    p.add_argument("--transaction-max-timeout-ms", type=int, metavar="MS",
                   help="without --max-transaction-timeout: the timeout assumed for a transaction whose coordinator "
                        "cannot give it (no transactional id, id not found, or a broker without ListTransactions), "
                        "instead of the cluster's transaction.max.timeout.ms read with DescribeConfigs (15 minutes "
                        "when no broker answers)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the tool's table")
    p.add_argument("--abort", action="store_true",
                   help="abort the hanging transactions found (WriteTxnMarkers, as kafka-transactions.sh abort); "
                        "a dry run unless confirmed with --yes or at the interactive prompt")
    p.add_argument("--start-offset", type=int, help="with --abort: only the transaction starting at this offset")
    p.add_argument("--yes", action="store_true", help="with --abort: abort without asking")
    p.add_argument("--dry-run", action="store_true", help="with --abort: only show what would be aborted")
    p.add_argument(UNCONFIRMED_FLAG, action="store_true",
                   help="with --abort: abort unconfirmed findings too (reason unconfirmed_coordinator_cannot_be_asked: "
                        "no coordinator was asked and its log did not know the producer or could not be read, the "
                        "age is the producer's last timestamp). Without it --abort "
                        "leaves them alone, --yes or not: each may be a live transaction (event-time timestamps, a "
                        "producer clock behind, a timeout above the threshold). Give it only after checking each one "
                        "as the docs say (Hanging transactions: Unconfirmed findings)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds for each request (default 30)")


def run_cli(args: Any, *, stdin: Any = None, stdout: Any = None, stderr: Any = None) -> int:
    out, err, inp = stdout or sys.stdout, stderr or sys.stderr, stdin or sys.stdin
    if args.partition is not None and args.topic is None:
        print("txnguard hanging: --partition needs --topic", file=err)
        return 2
    if (args.start_offset is not None or args.yes or args.dry_run or args.abort_unconfirmed_i_checked) \
            and not args.abort:
        print(f"txnguard hanging: --start-offset, --yes, --dry-run and {UNCONFIRMED_FLAG} go with --abort", file=err)
        return 2
    if args.transaction_max_timeout_ms is not None and (args.max_transaction_timeout is not None
                                                        or args.transaction_max_timeout_ms <= 0):
        print("txnguard hanging: --transaction-max-timeout-ms is a positive number of milliseconds, without "
              "--max-transaction-timeout (which sets the one threshold itself)", file=err)
        return 2
    if args.timeout_margin < 0 or (args.max_transaction_timeout is not None and args.max_transaction_timeout < 0):
        print("txnguard hanging: --timeout-margin and --max-transaction-timeout are not negative", file=err)
        return 2
    if args.bootstrap is None and args.config is None:
        print("txnguard hanging: give --bootstrap or --config", file=err)
        return 2
    try:
        connect = _connection_settings(args)
        bootstrap = [parse_host_port("--bootstrap", b.strip()) for b in args.bootstrap.split(",")] \
            if args.bootstrap else list(connect.upstream)
    except (ConfigError, OSError) as e:
        print(f"txnguard hanging: {e}", file=err)
        return 2
    scope = hanging_io.Scope(topic=args.topic, partition=args.partition, broker_id=args.broker_id)
    return asyncio.run(_run(args, bootstrap, scope, out, err, inp, connect))


def rule_of_args(args: Any) -> Rule:
    """--max-transaction-timeout MINUTES: find-hanging's rule; without it, each transaction's own timeout."""
    if args.max_transaction_timeout is not None:
        return MaxTimeout(args.max_transaction_timeout * 60_000)
    return OwnTimeout(margin_ms=int(args.timeout_margin * 1000), unknown_ms=args.transaction_max_timeout_ms)


class _Connect(NamedTuple):
    """How the CLI reaches the cluster: a proxy config's upstream, TLS and SASL (--config), or nothing set."""

    upstream: tuple[HostPort, ...] = ()
    ssl_context: Any = None
    auth: Any = None


def _connection_settings(args: Any) -> _Connect:
    """TLS and SASL of the proxy config given with --config (none without it): the proxy's own principal."""
    if args.config is None:
        return _Connect()
    cfg = load(args.config)
    return _Connect(cfg.upstream, upstream_ssl_context(cfg), cfg.upstream_auth)


async def _run(args: Any, bootstrap: list[HostPort], scope: hanging_io.Scope, out: Any, err: Any, inp: Any,
               connect: _Connect) -> int:
    admin = hanging_io.ClusterAdmin(bootstrap, timeout_s=args.timeout, ssl_context=connect.ssl_context,
                                    auth=connect.auth)
    try:
        try:
            result = await hanging_io.scan(admin, scope, rule_of_args(args))
        except (hanging_io.HangingScanError, UpstreamError, OSError, CodecError, TimeoutError) as e:
            print(f"txnguard hanging: {e}", file=err)
            return 1
        for tp, problem in sorted(result.errors.items()):
            print(f"txnguard hanging: {tp[0]}-{tp[1]}: {problem}", file=err)
        if result.transaction_log not in (None, "read"):  # why the log could not stand in for the coordinator
            print(f"txnguard hanging: the coordinator's log was not read, so nothing is confirmed: "
                  f"{result.transaction_log}", file=err)
        elif result.transaction_log_unread:
            print(f"txnguard hanging: {TRANSACTION_LOG} partitions {list(result.transaction_log_unread)} were not read "
                  "to their end: findings of the producers whose ids they hold are listed unconfirmed", file=err)
        if result.unconfirmed:
            limit = (f"{args.max_transaction_timeout} minutes (--max-transaction-timeout)"
                     if args.max_transaction_timeout is not None
                     else f"{result.unknown_timeout_ms} ms ({result.unknown_timeout_source})")
            print("txnguard hanging: the brokers lack ListTransactions and DescribeTransactions (Kafka < 3.0): "
                  f"open transactions whose producer's last timestamp is older than {limit} are listed unconfirmed "
                  "by their coordinator (a live transaction with old timestamps, or one whose abort marker is "
                  "still being written, would be listed too)", file=err)
        aborted: list[dict[str, Any]] = []
        status = 1 if result.errors else 0
        if not args.json:  # what was found first, then what is done about it
            out.write(table(result.findings, result.now_ms))
        if args.abort:
            chosen = [f for f in result.findings if args.start_offset is None or f.start_offset == args.start_offset]
            for f in chosen:
                outcome = await _abort_one(admin, f, args, out, err, inp)
                aborted.append({**f.as_dict(result.now_ms), "outcome": outcome})
                # Left alone (unconfirmed, no flag) is the command's own refusal, like a declined prompt: not a failure.
                if outcome not in ("NONE", "dry_run", "declined", "left_unconfirmed"):
                    status = 1
        if args.json:
            report: dict[str, Any] = {
                "findings": [f.as_dict(result.now_ms) for f in result.findings],
                "scanned_partitions": result.partitions, "described_partitions": result.described,
                "oldest_open_transaction_age_ms": result.oldest_open_age_ms,
                "rule": "max_transaction_timeout" if isinstance(rule_of_args(args), MaxTimeout) else "own_timeout",
                "max_transaction_timeout_ms": None if args.max_transaction_timeout is None
                else args.max_transaction_timeout * 60_000,
                "timeout_margin_ms": None if args.max_transaction_timeout is not None
                else int(args.timeout_margin * 1000),
                "unconfirmed": result.unconfirmed,
                "transaction_log": result.transaction_log,
                "transaction_log_unread_partitions": list(result.transaction_log_unread),
                "unknown_transaction_timeout_ms": result.unknown_timeout_ms,
                "unknown_transaction_timeout_source": result.unknown_timeout_source,
                "errors": {f"{t}-{p}": problem for (t, p), problem in sorted(result.errors.items())},
            }
            if args.abort:
                report["aborts"] = aborted
            print(json.dumps(report, indent=2), file=out)
        return status
    finally:
        await admin.close()


async def _abort_one(admin: hanging_io.ClusterAdmin, f: Finding, args: Any, out: Any, err: Any, inp: Any) -> str:
    """One abort: the outcome's name (NONE, an error name, dry_run, declined, TRANSACTION_GONE, left_unconfirmed,
    lookup_failed, failed). A broker that lacks an API the abort needs (WriteTxnMarkers v1, DescribeProducers) is
    one line naming both, and the outcome a failure (exit 1), like any other refused abort."""
    # Progress goes to stderr when stdout carries JSON.
    say = err if args.json else out
    where = f"topic {f.topic} partition {f.partition} producer id {f.producer_id} start offset {f.start_offset}"
    if not f.confirmed:
        if not args.abort_unconfirmed_i_checked:
            print(f"left alone: the transaction on {where} is unconfirmed ({f.reason}); it may be a live transaction "
                  f"({MAY_BE_LIVE}). Check it as the docs say, then abort it with {UNCONFIRMED_FLAG}", file=say)
            return "left_unconfirmed"
        print(f"unconfirmed, aborted only because of {UNCONFIRMED_FLAG}: the transaction on {where} may be a live "
              f"transaction ({MAY_BE_LIVE}); aborting a live one writes an abort marker here while it may commit on "
              "its other partitions", file=err)
    try:
        plan = await hanging_io.plan_abort(admin, f)
    except (hanging_io.HangingScanError, UpstreamError, OSError, CodecError, TimeoutError) as e:
        print(f"cannot abort {f.topic}-{f.partition} at {f.start_offset}: {e}", file=err)
        return "lookup_failed"
    if plan.spec is None:
        print(f"no open transaction starts at offset {f.start_offset} on {f.topic}-{f.partition} any more: "
              "nothing to abort", file=say)
        return "TRANSACTION_GONE"
    what = plan.spec.describe(f.start_offset)
    if args.dry_run or (not args.yes and not _interactive(inp)):
        print(f"dry run: would abort the hanging transaction on {what}"
              f"{'' if args.dry_run else '; confirm with --yes'}", file=say)
        return "dry_run"
    if not args.yes:
        print(f"Abort the hanging transaction on {what}? [y/N] ", end="", file=err, flush=True)
        answer = inp.readline().strip().lower()
        if answer not in ("y", "yes"):
            print("not aborted", file=say)
            return "declined"
    try:
        outcome = await hanging_io.abort(admin, plan)
    except (hanging_io.HangingScanError, UpstreamError, OSError, CodecError, TimeoutError) as e:
        print(f"abort of {what} failed: {e}", file=err)
        return "failed"
    if outcome == "NONE":
        print(f"aborted the hanging transaction on {what}", file=say)
    else:
        print(f"abort of {what} failed: {outcome}", file=err)
    return outcome


def _interactive(inp: Any) -> bool:
    try:
        return bool(inp.isatty())
    except (AttributeError, ValueError):
        return False

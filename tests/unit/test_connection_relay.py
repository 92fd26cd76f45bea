"""The relay's fast path (`Connection.relay_from_client` / `relay_from_broker`): whole frames that need no
reading leave as one write of the read they came in, with the general path's book-keeping, in order, never
split or merged across what the general path would do. The shell calls the fast path first and hands
`receive_from_*` only what it left; the core's own `receive_from_*` does the same inside."""

from __future__ import annotations

import datetime
import random
from typing import Any

import pytest
from connection_playbook import (
    EPOCH,
    PID,
    T0,
    T1,
    TXN,
    Emitted,
    Like,
    Playbook,
    add_offsets,
    add_offsets_response,
    add_partitions,
    add_partitions_response,
    api_versions_request,
    correlation_ids,
    end_txn,
    end_txn_response,
    fetch_request,
    fetch_response,
    heartbeat,
    heartbeat_response,
    init_producer_id,
    init_producer_id_response,
    of_type,
    produce,
    produce_response,
    request,
    request_module,
    response,
    response_module,
    steps,
    to_broker,
    to_client,
    txn_offset_commit,
    txn_offset_commit_response,
)
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i64

from txnguard.codecs.addresses import AddressUnavailable
from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.groups import CONSUMER_OFFSETS, offsets_partition_for
from txnguard.connection import core
from txnguard.connection.commands import (
    AnsweredLocally,
    Ask,
    Close,
    Command,
    Decided,
    Direction,
    PauseReading,
    RequestSeen,
    ResumeReading,
    Rewritten,
    SendToBroker,
    SendToClient,
    Side,
    StartTimer,
)
from txnguard.connection.ledger import Ledger, Passed, PassedOffsets
from txnguard.verification import decisions, inventory
from txnguard.verification.decisions import Decision
from txnguard.verification.in_doubt import EndTxnLedger, InDoubtLimits
from txnguard.verification.registry import RegistryLimits


def metadata_request(correlation_id: int) -> bytes:
    m = request_module(ApiKey.METADATA, 12)
    return request(m.MetadataRequest(topics=None, allow_auto_topic_creation=False,
                                     include_topic_authorized_operations=False), correlation_id)


def metadata_response(correlation_id: int) -> bytes:
    m = response_module(ApiKey.METADATA, 12)
    return response(ApiKey.METADATA, 12, correlation_id, m.MetadataResponse(
        throttle_time=datetime.timedelta(0),
        brokers=(m.MetadataResponseBroker(node_id=i32(1), host="kafka-1", port=i32(9092), rack=None),),
        cluster_id="c", controller_id=i32(1), topics=()))


def identified(pb: Playbook) -> None:
    """The first request names the client (the general path's business); the fast path starts after it."""
    pb.relays(heartbeat(0))
    pb.delivers(heartbeat_response(0))


def test_whole_frames_of_one_read_leave_as_that_read_in_one_write():
    pb = Playbook()
    identified(pb)
    read = b"".join([produce(1, [T0], transactional=False), heartbeat(2), produce(3, [T0], transactional=False,
                                                                                   version=7), fetch_request(4)])
    out = pb.client_sends(read)
    assert out == [SendToBroker([read])]
    assert out[0].data[0] is read  # the read itself: no slice, no copy
    assert pb.conn.in_flight == 4
    # (the core never reads a Produce response below v10: a v9 one stands in for v7's)
    answers = produce_response(1, [T0]) + heartbeat_response(2) + produce_response(3, [T0])
    assert correlation_ids(to_client(pb.broker_answers(answers + fetch_response(4, b"r" * 100)))) == [1, 2, 3, 4]
    assert pb.traffic.frames_in[0] == 2 and pb.traffic.frames_in[12] == 2 and pb.traffic.frames_in[1] == 1
    assert pb.conn.inventory is None or pb.conn.inventory.produce_versions == {7, 9}


def test_a_read_that_ends_inside_a_frame_forwards_the_whole_frames_and_keeps_the_rest():
    pb = Playbook()
    identified(pb)
    first, second = heartbeat(1), produce(2, [T0], transactional=False)
    out = pb.client_sends(first + second[:20])
    assert [type(c) for c in out] == [SendToBroker] and to_broker(out) == first
    assert to_broker(pb.client_sends(second[20:])) == second
    assert correlation_ids(to_client(pb.broker_answers(heartbeat_response(1) + produce_response(2, [T0])))) == [1, 2]


def test_a_frame_the_fast_path_leaves_is_forwarded_after_the_ones_before_it():
    pb = Playbook()
    identified(pb)
    pb.transaction_with(T0)
    frames = [heartbeat(1), produce(2, [T0]), heartbeat(3), api_versions_request(4), heartbeat(5)]
    out = pb.client_sends(*frames)
    assert to_broker(out) == b"".join(frames)  # the transactional write, verified at once, in its place
    assert len(of_type(out, SendToBroker)) == 1  # still one write
    assert of_type(out, Ask) == []


def test_a_held_request_holds_the_frames_behind_it_but_not_those_before():
    pb = Playbook()
    identified(pb)
    frames = [heartbeat(1), produce(2, [T0]), heartbeat(3)]  # no evidence: the verifier is asked
    out = pb.client_sends(*frames)
    assert to_broker(out) == frames[0]
    [ask] = of_type(out, Ask)
    assert ask.check_id == 1
    assert of_type(out, PauseReading) == [PauseReading(Side.CLIENT, "verification")]
    assert pb.conn.in_flight == 2


def test_acks_zero_takes_no_place_in_the_queue_on_the_fast_path():
    pb = Playbook()
    identified(pb)
    read = produce(1, [T0], transactional=False, acks=0) + heartbeat(2)
    assert pb.client_sends(read) == [SendToBroker([read])]
    assert pb.conn.in_flight == 1
    assert correlation_ids(to_client(pb.broker_answers(heartbeat_response(2)))) == [2]
    assert pb.traffic.frames_in[0] == 1


def test_max_in_flight_pauses_after_a_fast_read_and_answers_resume():
    pb = Playbook(max_in_flight=3)
    identified(pb)
    out = pb.client_sends(heartbeat(1), heartbeat(2), heartbeat(3))
    assert of_type(out, PauseReading) == [PauseReading(Side.CLIENT, "max_in_flight")]
    assert to_broker(out) == heartbeat(1) + heartbeat(2) + heartbeat(3)
    assert steps(pb.broker_answers(heartbeat_response(1))) == [SendToClient([heartbeat_response(1)]),
                                                              ResumeReading(Side.CLIENT, "max_in_flight")]


def test_the_shells_fast_call_leaves_the_frame_that_fills_the_queue_to_the_general_path():
    pb = Playbook(max_in_flight=3)
    identified(pb)
    read = heartbeat(1) + heartbeat(2) + heartbeat(3)
    done = pb.conn.relay_from_client(read)
    assert done == len(heartbeat(1) + heartbeat(2)) and pb.conn.in_flight == 2
    out = pb.conn.receive_from_client(memoryview(read)[done:])
    assert to_broker(out) == heartbeat(3)
    assert of_type(out, PauseReading) == [PauseReading(Side.CLIENT, "max_in_flight")]
    assert pb.conn.relay_from_client(heartbeat(4)) == 0  # paused at the limit: nothing more is taken fast


def test_a_response_with_a_local_answer_ready_behind_it_goes_the_general_way():
    pb = Playbook()
    identified(pb)
    out = pb.client_sends(heartbeat(1), api_versions_request(2, version=99))
    assert steps(out) == [AnsweredLocally(ApiKey.API_VERSIONS, 99, 2, "unsupported_version"),
                          SendToBroker([heartbeat(1)])]
    assert pb.conn.relay_from_broker(heartbeat_response(1)) == 0  # the answer to 2 must follow it at once
    assert correlation_ids(to_client(pb.conn.receive_from_broker(heartbeat_response(1)))) == [1, 2]


def test_an_oversized_frame_behind_whole_ones_closes_and_forwards_nothing_of_that_read():
    for sends in (Playbook.client_sends, lambda pb, *frames: _shell_client(pb, b"".join(frames))):
        pb = Playbook(max_frame_bytes=1000)
        identified(pb)
        out = sends(pb, heartbeat(1), b"\x00\x01\x00\x00")
        assert [type(c) for c in out] == [Close]
        assert out[0].reason == "frame_too_large" and out[0].frame_error is Direction.CLIENT_TO_BROKER


def test_a_broken_response_behind_whole_ones_closes_and_delivers_nothing_of_that_read():
    for answers in (Playbook.broker_answers, lambda pb, *frames: _shell_broker(pb, b"".join(frames))):
        pb = Playbook()
        identified(pb)
        pb.relays(heartbeat(1), heartbeat(2))
        out = answers(pb, heartbeat_response(1), heartbeat_response(7))  # 7 was never asked
        assert [type(c) for c in out] == [Close]
        assert out[0].reason == "response_out_of_order"


def test_an_address_bearing_response_is_still_rewritten_after_a_fast_request():
    pb = Playbook()
    identified(pb)
    assert pb.client_sends(metadata_request(1)) == [SendToBroker([metadata_request(1)])]
    out = pb.broker_answers(metadata_response(1))
    assert steps(out) == [Rewritten(ApiKey.METADATA, "addresses"), Like(SendToClient)]
    stream = to_client(out)
    assert b"proxy.local" in stream and b"kafka-1" not in stream


def test_the_keys_the_inventory_reads_take_the_general_path():
    assert set(inventory._TXN_ID_FIRST) <= core.SLOW_KEYS
    assert core.FAST_PRODUCE_VERSIONS.start == 3


def _mixed_stream() -> tuple[list[bytes], list[bytes]]:
    """Requests of every kind the fast path meets, and the broker's answers to those that get one."""
    requests, answers = [], []
    cid = 1
    for i in range(40):
        kind = i % 8
        if kind == 0:
            requests.append(produce(cid, [T0], transactional=False, version=3 + i % 9, value=b"v" * (i * 37)))
            answers.append(produce_response(cid, [T0], version=max(8, 3 + i % 9)))  # read from v10 only
        elif kind == 1:
            requests.append(produce(cid, [T0], transactional=False, acks=0))
        elif kind == 2:  # transactional, added: verified at once (v3-v11, one or two partitions)
            parts = [T0] if i % 3 else [T0, T1]
            requests.append(produce(cid, parts, version=3 + i % 9, value=b"t" * (i * 29)))
            answers.append(produce_response(cid, parts, version=max(8, 3 + i % 9)))
        elif kind == 3:
            requests.append(metadata_request(cid))
            answers.append(metadata_response(cid))
        elif kind == 4:
            requests.append(fetch_request(cid))
            answers.append(fetch_response(cid, b"r" * (i * 101)))
        elif kind == 5:
            requests.append(api_versions_request(cid, version=99))  # answered locally, in turn
        else:
            requests.append(heartbeat(cid))
            answers.append(heartbeat_response(cid))
        cid += 1
    return requests, answers


def _chunks(frames: list[bytes], rng: random.Random) -> list[bytes]:
    """The frames' bytes cut into reads: mostly at frame boundaries (a few whole frames per read), sometimes
    anywhere (inside a length prefix, a header, a body)."""
    data = b"".join(frames)
    bounds, at = [], 0
    for f in frames:
        at += len(f)
        bounds.append(at)
    out, pos = [], 0
    while pos < len(data):
        if rng.random() < 0.7:
            later = [b for b in bounds if b > pos]
            cut = later[min(len(later) - 1, rng.randrange(4))]
        else:
            cut = pos + rng.choice([1, 3, 7, 40, 200, 1000, 5000, 100_000])
        out.append(data[pos:cut])
        pos = cut
    return out


def _facts(commands: list[Command], ledger: Ledger) -> list[Any]:
    """What the shell records of one call, in its order: the ledger's passed writes first (they came before the
    call's commands), then the commands; a decision in the form the guard's recording reads it."""
    passed, offsets, windows = ledger.take()
    facts: list[Any] = [_passed_fact(p) for p in passed]
    for offset in reversed(offsets):  # each in its place among the Produces, as the guard records them
        facts.insert(offset.place, _offsets_fact(offset))
    recorded = [c for c in commands if not isinstance(c, SendToBroker | SendToClient | RequestSeen)]
    if isinstance(commands, Emitted):  # the commands the facts are made of, compared between the paths
        for kind in {type(c) for c in recorded}:
            commands.see(kind)
    facts += [_decision_fact(c.decision) if isinstance(c, Decided) else type(c).__name__ for c in recorded]
    return [*facts, *windows]


def _decision_fact(d: Decision) -> tuple[Any, ...]:
    ctx = d.context
    assert ctx is not None
    return (ctx.client, ctx.api, ctx.transactional_id, ctx.producer_id, ctx.producer_epoch, ctx.api_version,
            [(r.target, r.verdict, r.decision, r.error, r.enforced) for r in d.records], ctx.mode, ctx.inspection_ms,
            d.elapsed_ms, d.cpu_ms, d.evidence, d.rejections, d.forward is ctx.frame)


def _passed_fact(p: Passed) -> tuple[Any, ...]:
    # The decision's wall time has no counterpart in a `Decision` (its record is stamped when recorded).
    return (p.client, "produce", p.transactional_id, p.producer_id, p.producer_epoch, p.api_version,
            [(f"{t}-{i}", p.verdict, "forwarded", None, False) for t, i in p.partitions], p.mode, p.inspection_ms,
            p.verification_ms, p.cpu_ms, p.verdict.evidence.value, {}, True)


def _offsets_fact(p: PassedOffsets) -> tuple[Any, ...]:
    return (p.client, "txn_offset_commit", p.transactional_id, p.producer_id, p.producer_epoch, p.api_version,
            [(f"group:{p.group}", p.verdict, "forwarded", None, False)], p.mode, p.inspection_ms, p.verification_ms,
            p.cpu_ms, p.verdict.evidence.value, {}, True)


def _inventory(pb: Playbook) -> tuple[Any, ...]:
    inv = pb.conn.inventory
    assert inv is not None
    return tuple(getattr(inv, name) for name in type(inv).__slots__)


def _shell_client(pb: Playbook, read: bytes) -> list[Command]:
    """What the shell (proxy/session.py) does with a client read: the fast path, then the general one."""
    done = pb.conn.relay_from_client(read)
    return [SendToBroker([read])] if done == len(read) else pb.conn.receive_from_client(read, done)


def _shell_broker(pb: Playbook, read: bytes) -> list[Command]:
    done = pb.conn.relay_from_broker(read)
    return [SendToClient([read])] if done == len(read) else pb.conn.receive_from_broker(read, done)


def test_the_fast_path_forwards_and_books_exactly_what_the_general_path_does():
    requests, answers = _mixed_stream()
    relayed = {"core": 0, "shell": 0}
    transactional = {"core": 0, "shell": 0}  # transactional writes the fast path checked
    for seed in range(12):
        rng = random.Random(seed)
        client_reads = _chunks(requests, rng)
        broker_reads = _chunks(answers, rng)
        runs = []
        for way in ("core", "shell", "general"):  # receive_from_* alone, as the shell calls it, no fast path
            pb = Playbook()
            pb.conn._fast = way != "general"
            pb.conn.inventory = inventory.ConnectionInventory("client", 0)
            pb.transaction_with(T0, T1)
            per_read, facts, stream = [], [], b""
            for read in client_reads:
                before = sum(pb.traffic.frames_in)
                out = _shell_client(pb, read) if way == "shell" else pb.client_sends(read)
                if way != "general" and out and isinstance(out[0], SendToBroker) and out[0].data[0] is read:
                    relayed[way] += sum(pb.traffic.frames_in) - before
                if way != "general":
                    transactional[way] += len(pb.conn.ledger.passed)
                per_read.append(to_broker(out))
                facts.append(_facts(out, pb.conn.ledger))
                stream += to_client(out)
            for read in broker_reads:
                out = _shell_broker(pb, read) if way == "shell" else pb.broker_answers(read)
                facts.append(_facts(out, pb.conn.ledger))
                stream += to_client(out)
            runs.append((per_read, facts, stream, pb.traffic.frames_in, pb.traffic.bytes_in, pb.traffic.frames_out,
                         pb.traffic.bytes_out, pb.traffic.rtt_buckets, pb.conn.in_flight, _inventory(pb)))
        assert runs[0] == runs[2], f"seed {seed}: the core's fast path"
        assert runs[1] == runs[2], f"seed {seed}: the shell's calls"
        per_read, _, stream, *_ = runs[0]
        assert b"".join(per_read) == b"".join(r for r in requests if b"\x00\x12\x00\x63" not in r[4:8])
        assert len(correlation_ids(stream)) == len(answers) + sum(1 for r in requests if r[4:8] == b"\x00\x12\x00\x63")
    assert relayed["core"] > 30 and relayed["shell"] > 30  # frames of reads carried whole (more were in part)
    assert transactional["core"] > 10 and transactional["shell"] > 10  # verified writes among them


# -- the transaction life cycle on the fast path -------------------------------------------------------------


def _transactions(count: int) -> list[tuple[list[bytes], list[bytes]]]:
    """A transactional producer's conversation, step by step (each step's requests, then their answers): a first
    request naming the client, InitProducerId, then per transaction AddPartitionsToTxn, two transactional writes,
    sometimes AddOffsetsToTxn and two Heartbeats behind it (three in flight: with max_in_flight 3 the queue is
    full at the second Heartbeat, so a read holding all three shows whether the fast path counted AddOffsetsToTxn),
    then (as an exactly-once producer sends it, once AddOffsetsToTxn was answered) a TxnOffsetCommit (v0-v4 in
    turn) between two more writes, then EndTxn (commit or abort)."""
    steps_: list[tuple[list[bytes], list[bytes]]] = [([heartbeat(0)], [heartbeat_response(0)]),  # names the client
                                                     ([init_producer_id(1)], [init_producer_id_response(1)])]
    cid = 2
    for i in range(count):
        steps_.append(([add_partitions(cid, [T0, T1])], [add_partitions_response(cid, [T0, T1])]))
        steps_.append(([produce(cid + 1, [T0], value=b"a" * (i * 31)), produce(cid + 2, [T1])],
                       [produce_response(cid + 1, [T0]), produce_response(cid + 2, [T1])]))
        cid += 3
        if i % 2 == 0:
            steps_.append(([add_offsets(cid), heartbeat(cid + 1), heartbeat(cid + 2)],
                           [add_offsets_response(cid), heartbeat_response(cid + 1), heartbeat_response(cid + 2)]))
            version = (3, 0, 4, 2, 1)[i // 2 % 5]
            steps_.append(([produce(cid + 3, [T0]), txn_offset_commit(cid + 4, version=version),
                            produce(cid + 5, [T1])],
                           [produce_response(cid + 3, [T0]), txn_offset_commit_response(cid + 4, version=version),
                            produce_response(cid + 5, [T1])]))
            cid += 6
        steps_.append(([end_txn(cid, committed=i % 3 != 2)], [end_txn_response(cid)]))
        cid += 1
    return steps_


def _state(pb: Playbook) -> tuple[Any, ...]:
    """What the rules learned (the registry's record of the producer, the EndTxn defence's ledger) and what the
    inventory noted of the client."""
    record = pb.registry.get(TXN)
    ledger = pb.rules.in_doubt
    assert ledger is not None
    return (None if record is None else dict(vars(record)), dict(ledger.endings), len(ledger), _inventory(pb))


# max_in_flight 3: the queue's room runs out inside a step's reads, so the fast path must count each life-cycle
# request it takes (a frame too many taken in place would not pause the client where the general path does).
@pytest.mark.parametrize("max_in_flight", [100, 3])
def test_the_life_cycle_on_the_fast_path_books_and_learns_exactly_what_the_general_path_does(max_in_flight: int):
    conversation = _transactions(10)
    observed = {"core": 0, "shell": 0}  # life-cycle frames (both ways) carried whole by the fast path
    commits = {"core": set(), "shell": set()}  # TxnOffsetCommit versions the fast path checked in place
    for seed in range(12):
        rng = random.Random(seed)
        cuts = [(_chunks(requests, rng), _chunks(answers, rng)) for requests, answers in conversation]
        runs = []
        for way in ("core", "shell", "general"):
            pb = Playbook(max_in_flight=max_in_flight)
            pb.conn._fast = way != "general"
            pb.rules.in_doubt = EndTxnLedger(InDoubtLimits())
            pb.rules.offsets_partitions = 50  # learned (the general path asks for it once per proxy)
            pb.conn.inventory = inventory.ConnectionInventory("client", 0)
            per_read, facts, stream, states = [], [], b"", []
            for client_reads, broker_reads in cuts:
                for read in client_reads:
                    out = _shell_client(pb, read) if way == "shell" else pb.client_sends(read)
                    if way != "general" and out and isinstance(out[0], SendToBroker) and out[0].data[0] is read:
                        observed[way] += sum(1 for f in (b"\x00\x18", b"\x00\x19", b"\x00\x1a") if read[4:6] == f)
                    if way != "general":
                        commits[way].update(o.api_version for o in pb.conn.ledger.offsets)
                    per_read.append(to_broker(out))
                    facts.append(_facts(out, pb.conn.ledger))
                    stream += to_client(out)
                states.append(_state(pb))  # an EndTxn is in doubt from its send to its answer
                for read in broker_reads:
                    out = _shell_broker(pb, read) if way == "shell" else pb.broker_answers(read)
                    if way != "general" and out and isinstance(out[0], SendToClient) and out[0].data[0] is read:
                        observed[way] += 1
                    facts.append(_facts(out, pb.conn.ledger))
                    stream += to_client(out)
                states.append(_state(pb))
            runs.append((per_read, facts, stream, states, pb.traffic.frames_in, pb.traffic.bytes_in,
                         pb.traffic.frames_out, pb.traffic.bytes_out, pb.conn.in_flight, _inventory(pb)))
        assert runs[0] == runs[2], f"seed {seed}: the core's fast path"
        assert runs[1] == runs[2], f"seed {seed}: the shell's calls"
        per_read, _, stream, states, *_ = runs[0]
        assert b"".join(per_read) == b"".join(r for requests, _ in conversation for r in requests)
        assert stream == b"".join(a for _, answers in conversation for a in answers)
        record, endings, open_end_txns, _ = states[-1]
        assert record is not None and record["producer_id"] == PID and record["producer_epoch"] == EPOCH
        assert open_end_txns == 0 and sum(endings.values()) == 10  # every EndTxn answered
    assert observed["core"] > 50 and observed["shell"] > 50
    assert commits["core"] == commits["shell"] == {0, 1, 2, 3, 4}


def test_an_add_partitions_refused_whole_as_concurrent_goes_to_the_general_path_which_asks_again():
    pb = Playbook()
    identified(pb)
    add = add_partitions(1, [T0])
    assert pb.conn.relay_from_client(add) == len(add)  # read and observed in place
    refused = add_partitions_response(1, [T0], error=ErrorCode.concurrent_transactions)
    assert pb.conn.relay_from_broker(refused) == 0  # the general path absorbs it
    out = pb.conn.receive_from_broker(refused)
    assert steps(out) == [PauseReading(Side.CLIENT, "concurrent_transactions"), Like(StartTimer)]


def test_an_add_partitions_the_end_txn_defence_would_hold_goes_to_the_general_path():
    pb = Playbook()
    pb.rules.in_doubt = EndTxnLedger(InDoubtLimits())
    identified(pb)
    # Another connection's EndTxn of this producer is in doubt: the next transaction waits for its answer.
    pb.rules.in_doubt.sent(TXN, PID, EPOCH, True, connection_id=2, now_ms=pb.clock.wall_ms())
    add = add_partitions(1, [T0])
    assert pb.conn.relay_from_client(add) == 0
    out = pb.conn.receive_from_client(add)
    assert steps(out) == [PauseReading(Side.CLIENT, "verification"), Like(Ask)]


def test_with_timeout_recovery_on_end_txn_takes_the_general_path_and_the_others_stay_fast():
    pb = Playbook(policy={"timeout_recovery": True})
    identified(pb)
    add, end = add_partitions(1, [T0]), end_txn(2)
    assert pb.conn.relay_from_client(add) == len(add)
    assert pb.conn.relay_from_client(end) == 0  # checked against the coordinator's timeout first
    assert to_broker(pb.conn.receive_from_client(end)) == end


def _moved_leader_answer(correlation_id: int) -> bytes:
    """A Produce v11 answer that names the partition's new leader and its address (KIP-951)."""
    m = response_module(ApiKey.PRODUCE, 11)
    return response(ApiKey.PRODUCE, 11, correlation_id, m.ProduceResponse(
        responses=(m.TopicProduceResponse(name="orders", partition_responses=(m.PartitionProduceResponse(
            index=i32(0), error_code=ErrorCode.not_leader_or_follower, base_offset=i64(-1), log_append_time=None,
            log_start_offset=i64(-1), record_errors=(), error_message=None,
            current_leader=m.LeaderIdAndEpoch(leader_id=i32(2), leader_epoch=i32(5))),)),),
        throttle_time=datetime.timedelta(0),
        node_endpoints=(m.NodeEndpoint(node_id=i32(2), host="kafka-2", port=i32(9092), rack=None),)))


def test_a_produce_answer_naming_no_broker_passes_on_the_fast_path_and_one_naming_a_broker_is_rewritten():
    pb = Playbook()
    identified(pb)
    pb.relays(produce(1, [T0], transactional=False, version=11))
    plain = produce_response(1, [T0], version=11)
    assert pb.conn.relay_from_broker(plain) == len(plain)  # read in place: no NodeEndpoints, nothing to rewrite
    pb.relays(produce(2, [T0], transactional=False, version=11))
    moved = _moved_leader_answer(2)
    assert pb.conn.relay_from_broker(moved) == 0
    out = pb.broker_answers(moved)
    assert steps(out) == [Rewritten(ApiKey.PRODUCE, "addresses"), Like(SendToClient)]
    stream = to_client(out)
    assert b"proxy.local" in stream and b"kafka-2" not in stream
    assert pb.cluster.learned == [(2, "kafka-2", 9092)]


def test_a_broker_the_proxy_has_no_listener_for_closes_the_connection_with_that_reason():
    pb = Playbook()

    def no_listener(node_id: int, host: str, port: int) -> tuple[str, int]:
        raise AddressUnavailable(f"no listener for broker {node_id}: port taken")

    pb.cluster.client_address_for = no_listener  # type: ignore[method-assign]
    pb.relays(metadata_request(1))
    out = pb.broker_answers(metadata_response(1))
    assert out == [Close("broker_listener_unavailable",
                         "broker response: no listener for broker 1: port taken", "error", None)]
    assert pb.conn.closed


# -- TxnOffsetCommit on the fast path ---------------------------------------------------------------------------
#
# Each sequence is played twice, through the shell's calls (the fast path first) and through the general path
# alone, and what leaves (bytes, commands, the facts the shell records, the inventory, the counters, the queue)
# must be the same; then what the fast path itself did is asserted: it took the TxnOffsetCommit or left it.


def _commit_both_ways(setup: Any, requests: list[bytes], answers: list[bytes] | None = None,
                      policy: dict[str, Any] | None = None) -> tuple[list[int], list[Any], list[str], Playbook]:
    """`requests` one read each, then `answers` one read each, fast and general; (how many bytes of each request
    read the fast path took, the facts per read, the questions asked, the fast run's playbook)."""
    runs, taken, plays = [], [], []
    for fast in (True, False):
        pb = Playbook(policy=policy)
        pb.conn._fast = fast
        pb.conn.inventory = inventory.ConnectionInventory("client", 0)
        identified(pb)
        setup(pb)
        per_read, facts, questions = [], [], []
        for read in requests:
            if fast:  # as the shell: the fast call, then the general path with what it left
                done = pb.conn.relay_from_client(read)
                taken.append(done)
                out = [SendToBroker([read])] if done == len(read) else pb.conn.receive_from_client(read, done)
            else:
                out = pb.client_sends(read)
            questions += [type(c.question).__name__ for c in out if isinstance(c, Ask)]
            per_read.append(to_broker(out))
            per_read.append(to_client(out))
            facts.append(_facts(out, pb.conn.ledger))
        for read in answers or []:
            out = _shell_broker(pb, read) if fast else pb.broker_answers(read)
            per_read.append(to_client(out))
            facts.append(_facts(out, pb.conn.ledger))
        runs.append((per_read, facts, questions, pb.traffic.frames_in, pb.traffic.bytes_in, pb.traffic.frames_out,
                     pb.conn.in_flight, _inventory(pb), pb.conn.mode, dict(vars(pb.registry.get(TXN) or object()))))
        plays.append(pb)
    assert runs[0] == runs[1]
    return taken, runs[0][1], runs[0][2], plays[0]


def _evidence_for_group(pb: Playbook, offsets_partitions: int | None = 50) -> None:
    """InitProducerId and AddOffsetsToTxn(g) were answered (local evidence for the group g)."""
    pb.transaction_with(T0)
    pb.registry.added(TXN, PID, EPOCH, pb.clock.wall_ms(), group="g")
    pb.rules.offsets_partitions = offsets_partitions


def test_a_txn_offset_commit_with_local_evidence_is_checked_in_place_and_recorded_as_the_general_path_would():
    for version in range(5):
        commit = txn_offset_commit(1, version=version)
        taken, facts, questions, fast = _commit_both_ways(_evidence_for_group, [commit],
                                                          [txn_offset_commit_response(1, version=version)])
        assert taken == [len(commit)] and questions == []  # the fast path took it whole
        [[fact], [window]] = facts
        [(target, verdict, decision, error, enforced)] = fact[6]
        assert fact[1:6] == ("txn_offset_commit", TXN, PID, EPOCH, version)
        assert (target, verdict.evidence.value, decision, error, enforced) == ("group:g", "local", "forwarded",
                                                                               None, False)
        assert window == ("local", 0.0)  # its answer closed the check-to-append window
        assert fast.conn.inventory is not None and fast.conn.inventory.txn_offset_commit_versions == {version}


def test_an_offset_commit_among_writes_keeps_its_place_in_the_ledger():
    read = produce(1, [T0]) + txn_offset_commit(2) + produce(3, [T0]) + txn_offset_commit(4, version=0)
    taken, [facts], _, _ = _commit_both_ways(_evidence_for_group, [read])
    assert taken == [len(read)]
    assert [f[1] for f in facts] == ["produce", "txn_offset_commit", "produce", "txn_offset_commit"]


def test_a_txn_offset_commit_whose_group_has_only_the_coordinators_word_is_taken_with_that_evidence():
    """The coordinator said "Ongoing" with the group's __consumer_offsets partition (no AddOffsetsToTxn seen here):
    the registry holds that partition, not the group, so only the right partition finds it. A given answer is
    evidence only within evidence_ttl_ms (60 s here; a gateway's default keeps none: the next test)."""
    def setup(pb: Playbook) -> None:
        pb.registry.limits = RegistryLimits(evidence_ttl_ms=60_000)
        pb.rules.offsets_partitions = 50
        partition = (CONSUMER_OFFSETS, offsets_partition_for("g", 50))
        pb.registry.coordinator_says_ongoing(TXN, PID, EPOCH, 1, {T0}, {partition}, pb.clock.wall_ms())

    commit = txn_offset_commit(1)
    taken, [[fact]], _, _ = _commit_both_ways(setup, [commit])
    assert taken == [len(commit)] and fact[6][0][1].evidence.value == "cache"


def test_a_txn_offset_commit_whose_group_has_only_the_coordinators_word_is_asked_again_by_a_gateway():
    """The same answer given to a gateway (its default limits): not evidence for the next write, asked again."""
    def setup(pb: Playbook) -> None:
        pb.rules.offsets_partitions = 50
        partition = (CONSUMER_OFFSETS, offsets_partition_for("g", 50))
        pb.registry.coordinator_says_ongoing(TXN, PID, EPOCH, 1, {T0}, {partition}, pb.clock.wall_ms())

    taken, [facts], questions, _ = _commit_both_ways(setup, [txn_offset_commit(1)])
    assert taken == [0] and facts == ["PauseReading", "Ask"] and questions == ["VerifyPartitions"]


def test_a_txn_offset_commit_of_a_group_never_added_goes_to_the_general_path_which_asks():
    taken, [facts], questions, _ = _commit_both_ways(_evidence_for_group, [txn_offset_commit(1, group="h")])
    assert taken == [0] and facts == ["PauseReading", "Ask"] and questions == ["VerifyPartitions"]


def test_a_txn_offset_commit_of_a_fenced_epoch_goes_to_the_general_path_which_rejects_it():
    taken, [facts], _, _ = _commit_both_ways(_evidence_for_group, [txn_offset_commit(1, epoch=EPOCH + 1)])
    assert taken == [0] and facts == ["PauseReading", "Ask"]  # a newer epoch than known: asked

    def bumped(pb: Playbook) -> None:
        _evidence_for_group(pb)
        pb.registry.init_producer_id(TXN, PID, EPOCH + 1, 60_000, pb.clock.wall_ms())

    taken, [[decided, answered]], _, _ = _commit_both_ways(bumped, [txn_offset_commit(1)])
    assert taken == [0] and answered == "AnsweredLocally"
    assert [(r[2], r[3].name) for r in decided[6]] == [("rejected", "INVALID_PRODUCER_EPOCH")]  # java family


def test_a_txn_offset_commit_before_the_offsets_partition_count_is_known_goes_to_the_general_path():
    taken, [facts], questions, _ = _commit_both_ways(lambda pb: _evidence_for_group(pb, None), [txn_offset_commit(1)])
    assert taken == [0] and facts == ["PauseReading", "Ask"] and questions == ["CountOffsetsPartitions"]


def test_a_txn_offset_commit_the_policy_leaves_off_is_forwarded_unchecked_on_the_fast_path():
    commit = txn_offset_commit(1)
    taken, facts, _, fast = _commit_both_ways(_evidence_for_group, [commit, txn_offset_commit(2, group="h")],
                                              [txn_offset_commit_response(1), txn_offset_commit_response(2)],
                                              policy={"rules": [{"topic": "__consumer_offsets", "mode": "off"}]})
    assert taken == [len(commit), len(commit)]  # no evidence needed: nothing is checked, nothing recorded
    assert facts == [[], [], [], []]  # no decision, no window
    assert fast.conn.inventory is not None and fast.conn.inventory.txn_offset_commit_versions == {3}


def test_a_txn_offset_commit_in_monitor_mode_is_taken_and_recorded_in_that_mode():
    commit = txn_offset_commit(1)
    taken, [[fact]], _, _ = _commit_both_ways(_evidence_for_group, [commit],
                                              policy={"rules": [{"topic": "__consumer_offsets", "mode": "monitor"}]})
    assert taken == [len(commit)] and fact[7].value == "monitor"


def test_a_txn_offset_commit_v5_is_transaction_version_2_and_not_taken(monkeypatch: Any):
    taken, [facts], _, _ = _commit_both_ways(_evidence_for_group, [txn_offset_commit(1, version=5)])
    assert taken == [0] and facts == []  # the general path forwards it unchecked
    # Not only because the in-place reader stops at v4: v5 has v4's shape, and one that read it changes nothing.
    read = decisions.read_txn_offset_commit

    def reads_v5(body: Any, head: Any, *bounds: int) -> Any:
        return read(body, head._replace(api_version=min(head.api_version, 4)), *bounds)

    monkeypatch.setattr(decisions, "read_txn_offset_commit", reads_v5)
    v5_head = decisions.RequestHead(ApiKey.TXN_OFFSET_COMMIT, 5, 1)
    assert reads_v5(memoryview(txn_offset_commit(1, version=5))[4:], v5_head) is not None
    taken, [facts], _, _ = _commit_both_ways(_evidence_for_group, [txn_offset_commit(1, version=5)])
    assert taken == [0] and facts == []


def test_a_txn_offset_commit_with_verification_off_is_not_taken():
    def setup(pb: Playbook) -> None:
        _evidence_for_group(pb)
        pb.rules.enabled = False

    taken, [facts], _, _ = _commit_both_ways(setup, [txn_offset_commit(1)])
    assert taken == [0] and facts == []


def test_a_truncated_txn_offset_commit_is_judged_by_the_general_path():
    whole = txn_offset_commit(1)
    for cut in (6, 20, len(whole) - 30, len(whole) - 1):
        # The length prefix says what is there: a body that ends early, inside the header or the offsets.
        broken = (cut - 4).to_bytes(4, "big") + whole[4:cut]
        taken, [facts], _, _ = _commit_both_ways(_evidence_for_group, [broken])
        assert taken == [0] and facts == ["Close"], cut


def test_a_txn_offset_commit_with_a_lying_count_is_judged_by_the_general_path():
    whole = bytearray(txn_offset_commit(1, version=2))
    at = whole.rindex(b"\x00\x00\x00\x01\x00\x06orders")  # the topic count, then the topic's name
    whole[at:at + 4] = (1 << 20).to_bytes(4, "big")
    taken, [facts], _, _ = _commit_both_ways(_evidence_for_group, [bytes(whole)])
    assert taken == [0] and facts == ["Close"]


def test_a_txn_offset_commit_that_would_fill_the_queue_goes_to_the_general_path():
    pb = Playbook(max_in_flight=2)
    identified(pb)
    _evidence_for_group(pb)
    read = heartbeat(1) + txn_offset_commit(2)
    assert pb.conn.relay_from_client(read) == len(heartbeat(1))
    out = pb.conn.receive_from_client(memoryview(read)[len(heartbeat(1)):])
    assert out == [Like(Decided), Like(SendToBroker), Like(PauseReading)]


class _TickingClock:
    """Every perf() read a millisecond after the last, every cpu() read half of one: a timing measured over other
    steps than the general path's (reading the request, looking the verdict up) shows. Wall time stands still."""

    def __init__(self) -> None:
        self.seconds, self.on_cpu = 1000.0, 0.0

    def wall_ms(self) -> int:
        return 1_000_000

    def perf(self) -> float:
        self.seconds += 0.001
        return self.seconds

    def cpu(self) -> float:
        self.on_cpu += 0.0005
        return self.on_cpu


def test_a_txn_offset_commits_timings_are_taken_over_the_general_paths_steps():
    timings = []
    for fast in (True, False):
        pb = Playbook()
        pb.conn.clock = pb.clock = _TickingClock()  # type: ignore[assignment]
        pb.conn._fast = fast
        identified(pb)
        _evidence_for_group(pb)
        out = pb.client_sends(txn_offset_commit(1))
        assert to_broker(out) == txn_offset_commit(1)
        assert len(pb.conn.ledger.offsets) == (1 if fast else 0)
        [fact] = _facts(out, pb.conn.ledger)
        timings.append(tuple(round(t, 9) for t in fact[8:11]))  # inspection, verification, cpu (ms)
    assert timings[0] == timings[1] == (1.0, 1.0, 0.5)

"""The connection core as sequence diagrams: the client sends X, the broker answers Y, the core emits Z."""

from __future__ import annotations

import pytest
from connection_playbook import (
    T0,
    T1,
    Emitted,
    Like,
    Playbook,
    add_partitions,
    add_partitions_response,
    api_versions_request,
    correlation_ids,
    decode_produce_response,
    fetch_request,
    fetch_response,
    heartbeat,
    heartbeat_response,
    init_producer_id,
    init_producer_id_response,
    of_type,
    produce,
    produce_response,
    sasl_authenticate,
    sasl_authenticate_response,
    sasl_handshake,
    sasl_handshake_response,
    steps,
    to_broker,
    to_client,
)
from kio.schema.errors import ErrorCode

from txnguard.codecs import schemas
from txnguard.codecs.api_keys import ApiKey
from txnguard.connection.commands import (
    AnsweredLocally,
    Ask,
    Authenticated,
    Close,
    Decided,
    Direction,
    PauseReading,
    RawMode,
    ResumeReading,
    SendToBroker,
    SendToClient,
    Side,
)
from txnguard.verification.checks import PartitionVerdicts
from txnguard.verification.verdicts import Evidence, Outcome, Verdict, passed

NOT_ADDED = Verdict(Outcome.NOT_IN_TRANSACTION, Evidence.COORDINATOR, "not added")


# -- the relay --------------------------------------------------------------------------------------------


def test_an_uninspected_request_and_its_response_pass_as_the_original_bytes():
    pb = Playbook()
    request = heartbeat(1)
    assert to_broker(pb.client_sends(request)) == request
    answer = heartbeat_response(1)
    out = pb.broker_answers(answer)
    assert out == [SendToClient([answer])]  # the very chunk the broker sent: nothing copied
    assert pb.traffic.frames_in[12] == 1 and pb.traffic.frames_out[12] == 1
    assert pb.traffic.bytes_out[12] == len(answer)


def test_consecutive_responses_in_one_chunk_leave_as_one_buffer():
    pb = Playbook()
    pb.relays(heartbeat(1), heartbeat(2), heartbeat(3))
    chunk = heartbeat_response(1) + heartbeat_response(2) + heartbeat_response(3)
    out = pb.broker_answers(chunk)
    assert len(out) == 1 and isinstance(out[0], SendToClient)
    assert out[0].data == [chunk]


def test_a_large_response_next_in_order_is_streamed_before_it_is_complete():
    pb = Playbook()
    pb.relays(fetch_request(5))
    answer = fetch_response(5, b"r" * 300_000)
    first, second, third = answer[:3], answer[3:100_000], answer[100_000:]
    assert to_client(pb.broker_answers(first)) == b""           # not even the head yet
    assert to_client(pb.broker_answers(second)) == answer[:100_000]  # cut through, not assembled
    assert to_client(pb.broker_answers(third)) == answer[100_000:]
    assert pb.conn.in_flight == 0


def test_a_large_produce_the_proxy_need_not_read_is_forwarded_as_it_arrives():
    pb = Playbook()
    request = produce(4, [T0], transactional=False, value=b"x" * 3_000_000)  # 3 MB, never verified
    head, middle, tail = request[:2_000_000], request[2_000_000:2_500_000], request[2_500_000:]
    assert to_broker(pb.client_sends(head)) == head      # past 1 MiB: cut through, not assembled
    assert pb.conn.requests.buffered == 0
    assert to_broker(pb.client_sends(middle)) == middle
    assert to_broker(pb.client_sends(tail + heartbeat(5))) == tail + heartbeat(5)  # the next frame is framed again
    assert pb.traffic.frames_in[0] == 1 and pb.traffic.bytes_in[0] == len(request)
    answer = produce_response(4, [T0]) + heartbeat_response(5)
    assert to_client(pb.broker_answers(answer)) == answer
    assert pb.conn.in_flight == 0


def test_a_large_transactional_produce_is_assembled_to_be_verified():
    pb = Playbook()
    request = produce(4, [T0], value=b"x" * 3_000_000)
    assert to_broker(pb.client_sends(request[:2_000_000])) == b""  # verification reads every batch header
    assert pb.conn.requests.buffered == 2_000_000


def test_a_response_head_split_across_chunks_is_put_together():
    pb = Playbook()
    pb.relays(heartbeat(1), heartbeat(2))
    stream = heartbeat_response(1) + heartbeat_response(2)
    got = b"".join(to_client(pb.broker_answers(stream[i:i + 5])) for i in range(0, len(stream), 5))
    assert got == stream


def test_a_response_for_an_unknown_correlation_id_closes_the_connection():
    pb = Playbook()
    pb.relays(heartbeat(1))
    out = pb.broker_answers(heartbeat_response(99))
    assert out == [Close("response_out_of_order", "broker response: response 99 arrived for request 1", "warning",
                         Direction.BROKER_TO_CLIENT)]
    assert pb.broker_answers(heartbeat_response(1)) == []  # closed: nothing more comes out


def test_a_response_with_nothing_in_flight_closes_the_connection():
    pb = Playbook()
    [close] = pb.broker_answers(heartbeat_response(1)).see(Close)
    assert isinstance(close, Close) and close.reason == "response_out_of_order"


def test_a_request_over_the_frame_limit_closes_before_it_is_buffered():
    pb = Playbook(max_frame_bytes=1000)
    [close] = pb.client_sends(b"\x00\x01\x00\x00").see(Close)  # 65536 bytes announced
    assert isinstance(close, Close) and close.reason == "frame_too_large"
    assert close.frame_error is Direction.CLIENT_TO_BROKER


# -- ordering and local answers -------------------------------------------------------------------------------


def test_a_too_new_api_versions_is_answered_locally_in_turn_behind_requests_in_flight():
    pb = Playbook()
    pb.relays(heartbeat(1))
    out = pb.client_sends(api_versions_request(2, version=99))
    # The broker never sees it, and it waits behind request 1.
    assert steps(out) == [AnsweredLocally(ApiKey.API_VERSIONS, 99, 2, "unsupported_version")]
    stream = to_client(pb.broker_answers(heartbeat_response(1)))
    assert correlation_ids(stream) == [1, 2]
    _, body = schemas.decode_response(stream[len(heartbeat_response(1)) + 4:], ApiKey.API_VERSIONS, 0)
    assert body.error_code == ErrorCode.unsupported_version
    assert (0, 3, 9) in [(int(k.api_key), int(k.min_version), int(k.max_version)) for k in body.api_keys]


def test_max_in_flight_pauses_the_client_and_an_answer_resumes_it():
    pb = Playbook(max_in_flight=2)
    pb.relays(heartbeat(1))
    assert steps(pb.client_sends(heartbeat(2))) == [SendToBroker([heartbeat(2)]),
                                                    PauseReading(Side.CLIENT, "max_in_flight")]
    out = pb.broker_answers(heartbeat_response(1))
    assert steps(out) == [SendToClient([heartbeat_response(1)]), ResumeReading(Side.CLIENT, "max_in_flight")]


def test_acks_zero_produce_never_waits_for_a_response():
    pb = Playbook()
    request = produce(1, [T0], transactional=False, acks=0)
    assert to_broker(pb.client_sends(request)) == request
    assert pb.conn.in_flight == 0
    pb.relays(heartbeat(2))
    pb.delivers(heartbeat_response(2))


@pytest.mark.parametrize("read", ["the first", "a later"])
def test_draining_closes_once_the_last_response_is_delivered(read: str) -> None:
    # The first read names the client (the general path); a later one takes the fast path (the native book).
    pb = Playbook()
    if read == "a later":
        pb.relays(heartbeat(0))
        pb.delivers(heartbeat_response(0))
    pb.relays(heartbeat(1))
    assert pb.conn.drain() == [PauseReading(Side.CLIENT, "draining")]
    out = pb.broker_answers(heartbeat_response(1))
    assert steps(out) == [SendToClient([heartbeat_response(1)]), Close("draining", "proxy shutting down")]


# -- verification ------------------------------------------------------------------------------------------


def test_a_write_with_local_evidence_is_decided_at_once_and_forwarded_unchanged():
    pb = Playbook()
    pb.transaction_with(T0)
    request = produce(1, [T0])
    out = pb.client_sends(request)
    assert of_type(out, Ask) == []
    assert to_broker(out) == request
    [decided] = of_type(out, Decided)
    assert [r.decision for r in decided.decision.records] == ["forwarded"]
    pb.delivers(produce_response(1, [T0]))
    assert pb.conn.ledger.take() == ([], [], [("local", 0.0)])  # the check-to-append window, for the shell


def test_the_registry_learns_from_the_clients_own_init_and_add_partitions():
    pb = Playbook()
    pb.relays(init_producer_id(1))
    pb.delivers(init_producer_id_response(1))
    pb.relays(add_partitions(2, [T0]))
    pb.delivers(add_partitions_response(2, [T0]))
    out = pb.client_sends(produce(3, [T0]))
    # No Ask: local evidence, taken on the fast path (its decision goes to the ledger, not a command).
    assert steps(out) == [SendToBroker([produce(3, [T0])])]
    assert len(pb.conn.ledger.passed) == 1


def test_partial_rejection_across_two_partitions_merges_one_response_in_request_order():
    pb = Playbook()
    pb.transaction_with(T0)                       # T0 was added; T1 was not
    out = pb.client_sends(produce(1, [T1, T0]))   # the client lists T1 first
    [ask] = of_type(out, Ask)
    assert ask.question.partitions == (T1,)
    assert of_type(out, PauseReading) == [PauseReading(Side.CLIENT, "verification")]
    out = pb.conn.answered(ask.check_id, PartitionVerdicts({T1: NOT_ADDED}))
    [decided] = of_type(out, Decided)
    assert sorted(r.decision for r in decided.decision.records) == ["forwarded", "rejected"]
    _, reduced = schemas.decode_request(to_broker(out)[4:])
    assert [(str(t.name), int(p.index)) for t in reduced.topic_data for p in t.partition_data] == [T0]
    assert of_type(out, ResumeReading) == [ResumeReading(Side.CLIENT, "verification")]
    merged = to_client(pb.broker_answers(produce_response(1, [T0])))
    assert decode_produce_response(merged) == [
        ("orders", 1, ErrorCode.invalid_txn_state, "Partition was not added to the transaction"),
        ("orders", 0, ErrorCode.none, None),
    ]
    assert correlation_ids(merged) == [1]


def test_every_partition_rejected_is_answered_without_the_broker():
    pb = Playbook()
    ask = Like(Ask)
    assert steps(pb.client_sends(produce(1, [T0, T1]))) == [PauseReading(Side.CLIENT, "verification"), ask]
    out = pb.conn.answered(1, PartitionVerdicts({T0: NOT_ADDED, T1: NOT_ADDED}))
    assert steps(out) == [Like(Decided), AnsweredLocally(ApiKey.PRODUCE, 9, 1, "verification"),
                          ResumeReading(Side.CLIENT, "verification"), Like(SendToClient)]
    assert [(t, p, e) for t, p, e, _ in decode_produce_response(to_client(out))] == [
        ("orders", 0, ErrorCode.invalid_txn_state), ("orders", 1, ErrorCode.invalid_txn_state)]


def test_monitor_mode_forwards_what_it_would_reject_and_says_so():
    pb = Playbook(policy={"mode": "monitor"})
    request = produce(1, [T0])
    assert steps(pb.client_sends(request)) == [PauseReading(Side.CLIENT, "verification"), Like(Ask, check_id=1)]
    out = pb.conn.answered(1, PartitionVerdicts({T0: NOT_ADDED}))
    assert steps(out) == [Like(Decided), ResumeReading(Side.CLIENT, "verification"), SendToBroker([request])]
    [decided] = of_type(out, Decided)
    assert [r.decision for r in decided.decision.records] == ["forwarded_unenforced"]


def test_a_rejected_acks_zero_write_closes_the_connection_as_the_broker_does():
    pb = Playbook()
    out = pb.client_sends(produce(1, [T0], acks=0))
    assert steps(out) == [PauseReading(Side.CLIENT, "verification"), Like(Ask, check_id=1)]
    assert pb.conn.in_flight == 0  # no response will ever come for it
    out = pb.conn.answered(1, PartitionVerdicts({T0: NOT_ADDED}))
    assert steps(out) == [Like(Decided), Close("rejected_without_response",
                                               "a transactional acks=0 write failed verification", "warning")]


def test_requests_behind_a_held_one_wait_and_leave_in_the_clients_order():
    pb = Playbook()
    a, b, c = heartbeat(1), produce(2, [T0]), heartbeat(3)
    assert to_broker(pb.client_sends(a)) == a
    out = pb.client_sends(b, c)
    # b waits for its verification, c waits behind it
    assert steps(out) == [PauseReading(Side.CLIENT, "verification"), Like(Ask, check_id=1)]
    out = pb.conn.answered(1, PartitionVerdicts({T0: passed(Evidence.COORDINATOR)}))
    assert steps(out) == [Like(Decided), ResumeReading(Side.CLIENT, "verification"), SendToBroker([b + c])]
    stream = to_client(pb.broker_answers(heartbeat_response(1), produce_response(2, [T0]), heartbeat_response(3)))
    assert correlation_ids(stream) == [1, 2, 3]


def test_a_hold_released_before_an_earlier_response_still_answers_in_order():
    pb = Playbook()
    pb.relays(heartbeat(1))
    out = pb.client_sends(produce(2, [T0]), heartbeat(3))
    assert steps(out) == [PauseReading(Side.CLIENT, "verification"), Like(Ask, check_id=1)]
    # The verifier answers before the broker answered request 1: request 2 is rejected locally,
    # request 3 goes out; the local answer waits for request 1's response.
    out = pb.conn.answered(1, PartitionVerdicts({T0: NOT_ADDED}))
    assert steps(out) == [Like(Decided), AnsweredLocally(ApiKey.PRODUCE, 9, 2, "verification"),
                          ResumeReading(Side.CLIENT, "verification"), SendToBroker([heartbeat(3)])]
    stream = to_client(pb.broker_answers(heartbeat_response(1), heartbeat_response(3)))
    assert correlation_ids(stream) == [1, 2, 3]


def test_a_close_while_a_request_is_held_sends_nothing_when_the_answer_comes():
    pb = Playbook()
    out = pb.client_sends(produce(1, [T0]), heartbeat(2))
    assert steps(out) == [PauseReading(Side.CLIENT, "verification"), ask := Like(Ask, check_id=1)]
    pb.conn.connection_lost()
    assert pb.conn.answered(ask.fields["check_id"], PartitionVerdicts({T0: passed(Evidence.COORDINATOR)})) == []
    assert pb.client_sends(heartbeat(3)) == []


def test_a_verification_that_fails_closes_with_its_reason():
    pb = Playbook()
    assert steps(pb.client_sends(produce(1, [T0]))) == [PauseReading(Side.CLIENT, "verification"),
                                                        Like(Ask, check_id=1)]
    [close] = pb.conn.verification_failed(1, "verifier_error", "boom").see(Close)
    assert close.reason == "verifier_error" and close.level == "warning"


# -- SASL ----------------------------------------------------------------------------------------------------


def test_sasl_v0_handshake_turns_the_connection_into_a_byte_pipe():
    pb = Playbook(pre_auth_max_frame_bytes=512 * 1024)
    pb.relays(sasl_handshake(1, version=0))
    out = pb.broker_answers(sasl_handshake_response(1, version=0))
    assert steps(out) == [SendToClient([sasl_handshake_response(1, version=0)]), RawMode("sasl_handshake_v0")]
    token = b"\x00\x00\x00\x0c\x00user\x00secret"  # a raw SASL/PLAIN token: no Kafka header
    assert to_broker(pb.client_sends(token)) == token
    assert to_broker(pb.client_sends(b"\xff\xff")) == b"\xff\xff"  # not a frame: not read as one
    assert to_client(pb.broker_answers(b"\x00\x00\x00\x00")) == b"\x00\x00\x00\x00"


def test_sasl_authenticate_lifts_the_pre_authentication_frame_limit():
    pb = Playbook(pre_auth_max_frame_bytes=1024)
    pb.relays(sasl_handshake(1, version=1))
    pb.delivers(sasl_handshake_response(1, version=1))
    pb.relays(sasl_authenticate(2))
    assert steps(pb.broker_answers(sasl_authenticate_response(2))) == [
        Authenticated(), SendToClient([sasl_authenticate_response(2)])]
    big = produce(3, [T0], transactional=False, value=b"x" * 4096)
    assert to_broker(pb.client_sends(big)) == big


def test_before_authentication_completes_the_limit_holds():
    pb = Playbook(pre_auth_max_frame_bytes=1024)
    pb.relays(sasl_handshake(1, version=1))
    pb.delivers(sasl_handshake_response(1, version=1))
    [close] = pb.client_sends(produce(2, [T0], transactional=False, value=b"x" * 4096)).see(Close)
    assert close.reason == "frame_too_large"


# -- the playbook itself -------------------------------------------------------------------------------------


def test_a_command_the_test_leaves_unasserted_fails_it():
    pb = Playbook()
    out = pb.client_sends(produce(1, [T0]))       # no evidence: held, and the verifier asked
    assert to_broker(out) == b""                   # what a test that filters by type would look at
    assert [type(c) for _, c in pb.recorder.unasserted()] == [PauseReading, Ask]  # conftest fails on these
    assert steps(out) == [PauseReading(Side.CLIENT, "verification"), Like(Ask)]
    assert pb.recorder.unasserted() == []
    extra = Emitted([SendToBroker([b"x"]), Close("boom")], "a step")
    assert to_broker(extra) == b"x"
    assert extra.unasserted(facts=False) == [Close("boom")]
    extra.see()


def test_walking_or_unpacking_the_commands_asserts_none_of_them():
    extra = Emitted([SendToBroker([b"x"]), Close("boom")], "a step")
    for _ in extra:                                  # a walk looking for something
        pass
    first, second = extra                            # an unpacking
    assert list(extra) == [first, second]
    assert extra.unasserted(facts=False) == [SendToBroker([b"x"]), Close("boom")]
    [close] = extra.see(Close)                       # what the test looked at, said
    assert close.reason == "boom"
    assert extra.unasserted(facts=False) == [SendToBroker([b"x"])]
    assert extra[0] == SendToBroker([b"x"])          # an index asserts that command
    assert extra.unasserted(facts=False) == []

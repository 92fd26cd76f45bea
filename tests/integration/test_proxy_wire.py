"""The proxy on the wire, with the raw client: ordering, acks=0, ApiVersions, limits, bad input, upstream loss.

Each test reads like a sequence: what the client sends through the proxy, what
the real 3.5.2 broker does, what the client gets back, what the metrics say.
"""

from __future__ import annotations

import socket
import struct
import urllib.error
import urllib.request

import pytest
from kio.schema.errors import ErrorCode

from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.api_versions import INSPECTED_FROM
from txnguard.codecs.schemas import kio_version_range
from txnguard.testing.fixtures import fresh_topic
from txnguard.testing.proxy import broker_addresses, gateway_for
from txnguard.testing.raw import RawClient, RawProtocolError, build_batch

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(kafka_pool):
    return kafka_pool.get("3.5.2", 1)


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while True:
            if sock.recv(65536) == b"":
                return True
    except TimeoutError:
        return False
    except OSError:
        return True


def test_metadata_through_the_gateway_names_only_proxy_listeners(cluster, start_proxy):
    proxy = gateway_for(cluster, start_proxy)
    with RawClient.connect(proxy.bootstrap) as c:
        md = c.metadata()
    listed = {(b.host, b.port) for b in md.brokers}
    assert listed == {("127.0.0.1", proxy.proxy.listeners[n.id].address.port) for n in cluster.nodes}
    assert proxy.wire.leaks(broker_addresses(cluster)) == []


def test_api_versions_are_capped_to_what_the_proxy_decodes(cluster, start_proxy):
    proxy = gateway_for(cluster, start_proxy)
    with RawClient.connect(cluster.bootstrap_servers) as direct:
        broker = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in direct.api_versions().api_keys}
    with RawClient.connect(proxy.bootstrap) as c:
        seen = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in c.api_versions().api_keys}
    for key, (lo, hi) in seen.items():
        assert broker[key][0] <= lo <= hi <= broker[key][1]
        if key in INSPECTED_FROM:
            assert hi <= kio_version_range(key)[1]
    assert seen[0][0] == broker[0][0]  # Produce keeps the broker's minimum (KAFKA-18659)
    assert proxy.metric("txnguard_frames_total", {"api": "api_versions", "direction": "broker_to_client"}) == 1


def test_an_api_versions_request_newer_than_the_proxy_is_answered_like_a_broker(cluster, start_proxy):
    proxy = gateway_for(cluster, start_proxy)
    # ApiVersions v99, header v2: key, version, correlation id, client id, no tagged fields, empty body.
    body = struct.pack(">hhih", 18, 99, 5, 1) + b"x" + b"\x00" + b"\x00\x00\x00"
    with socket.create_connection(("127.0.0.1", proxy.proxy.bootstrap_address.port), timeout=5) as s:
        s.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", s.recv(4))[0]
        resp = b""
        while len(resp) < size:
            resp += s.recv(size - len(resp))
    correlation_id, error_code, n = struct.unpack_from(">ihi", resp, 0)
    assert (correlation_id, error_code) == (5, ErrorCode.unsupported_version)
    entries = [struct.unpack_from(">hhh", resp, 10 + 6 * i) for i in range(n)]
    assert (18, 0, kio_version_range(ApiKey.API_VERSIONS)[1]) in entries  # the client retries with v <= this
    assert proxy.metric("txnguard_local_responses_total", {"api": "api_versions", "reason": "unsupported_version"}) == 1


def test_acks_zero_produce_gets_no_response_and_later_responses_stay_paired(cluster, start_proxy, unique_name):
    topic = fresh_topic(cluster, unique_name("t"))
    proxy = gateway_for(cluster, start_proxy)
    with RawClient.connect(proxy.bootstrap) as c:
        assert c.produce({(topic, 0): build_batch([b"fire-and-forget"])}, acks=0) is None
        resp = c.produce({(topic, 0): build_batch([b"acked"])}, acks=-1)  # raises on a correlation mix-up
        assert resp.responses[0].partition_responses[0].error_code == ErrorCode.none
        md = c.metadata([topic])
        assert md.topics[0].name == topic
    with RawClient.connect(cluster.bootstrap_servers) as direct:
        assert direct.list_offsets(topic, 0, read_committed=False) == 2


def test_pipelined_requests_come_back_in_order_under_a_tiny_in_flight_limit(cluster, start_proxy):
    proxy = gateway_for(cluster, start_proxy, limits={"max_in_flight": 2})
    with RawClient.connect(proxy.bootstrap) as c:
        from kio.schema.metadata.v9.request import MetadataRequest

        payload = MetadataRequest(topics=(), allow_auto_topic_creation=False,
                                  include_cluster_authorized_operations=False,
                                  include_topic_authorized_operations=False)
        frames = b"".join(c.encode(payload, cid) for cid in range(100, 150))
        c.send_raw(frames)
        got = [struct.unpack_from(">i", c.read_frame(), 0)[0] for _ in range(50)]
    assert got == list(range(100, 150))


def _transactional_produce_cut_short() -> bytes:
    """A transactional Produce v9 whose record set claims more bytes than the frame holds."""
    import datetime
    import sys

    from kio.index import load_request_schema

    from txnguard.codecs.schemas import encode_request

    m = sys.modules[load_request_schema(0, 9).__module__]
    batch = build_batch([b"v" * 50], producer_id=1, producer_epoch=0, base_sequence=0, transactional=True)
    frame = encode_request(m.ProduceRequest(
        transactional_id="t", acks=-1, timeout=datetime.timedelta(seconds=5), topic_data=(m.TopicProduceData(
            name="x", partition_data=(m.PartitionProduceData(index=0, records=batch),)),)), 1, "c")
    body = frame[4:-30]
    return struct.pack(">i", len(body)) + body


@pytest.mark.parametrize(
    ("garbage", "reason"),
    [
        (struct.pack(">i", -5) + b"abc", "invalid_length"),
        (struct.pack(">i", 200 * 1024 * 1024), "frame_too_large"),
        (bytes([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xFC]) + b"\x03\x03", "tls_on_plaintext"),
        # Produce v9 whose body ends inside the transactional id: the proxy must read acks, and cannot.
        (struct.pack(">i", 14) + struct.pack(">hhih", 0, 9, 1, 0) + b"\x00\x05ab", "truncated"),
        # A transactional Produce the guard must inspect, whose record set claims more bytes than the
        # frame holds: refused by the bounds check before anything decodes it; the broker closes too.
        (_transactional_produce_cut_short(), "bounds_exceeded"),
    ],
    ids=["negative-length", "oversize", "tls-client-hello", "truncated-produce", "undecodable-txn-produce"],
)
def test_bad_frames_close_only_their_connection_with_a_reason(cluster, start_proxy, garbage, reason):
    proxy = gateway_for(cluster, start_proxy)
    with RawClient.connect(proxy.bootstrap) as healthy:
        healthy.api_versions()
        with socket.create_connection(("127.0.0.1", proxy.proxy.bootstrap_address.port), timeout=5) as bad:
            bad.sendall(garbage)
            assert _closed_within(bad, 5), "the proxy kept a connection that sent garbage"
        proxy.wait_for(lambda: proxy.metric("txnguard_connection_closes_total", {"reason": reason}) == 1,
                       what=f"a close with reason {reason}")
        assert healthy.metadata().brokers  # the neighbour never noticed
    assert proxy.proxy is not None and proxy.proxy.listeners  # and the proxy still runs


def test_a_partial_frame_that_never_completes_is_timed_out(cluster, start_proxy):
    proxy = gateway_for(cluster, start_proxy, limits={"partial_frame_timeout_s": 1.0})
    with socket.create_connection(("127.0.0.1", proxy.proxy.bootstrap_address.port), timeout=5) as s:
        s.sendall(struct.pack(">i", 100) + b"only-part")
        assert _closed_within(s, 6)
    assert proxy.metric("txnguard_connection_closes_total", {"reason": "partial_frame_timeout"}) == 1


def test_an_unreachable_broker_closes_the_client_instead_of_hanging(start_proxy):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # nothing listens here once the socket closes
    proxy = start_proxy(upstream=f"127.0.0.1:{dead}", limits={"connect_timeout_s": 2.0})
    # client ─ApiVersions─▶ proxy ─connect─▶ (nothing listens)   the proxy closes the client: the client sees the
    # close (or a reset), never its own read timeout running out, which is what a hang would end in.
    with pytest.raises((RawProtocolError, OSError)) as closed, RawClient.connect(proxy.bootstrap, timeout=60) as c:
        c.api_versions()
    assert not isinstance(closed.value, TimeoutError), f"the client waited out its own timeout: {closed.value!r}"
    assert proxy.metric("txnguard_connection_closes_total", {"reason": "upstream_unreachable"}) >= 1
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(proxy.admin_url + "/readyz", timeout=5)
    assert e.value.code == 503


def test_admin_endpoints(cluster, start_proxy):
    proxy = gateway_for(cluster, start_proxy)
    proxy.wait_for(lambda: proxy.proxy.ready()[0], what="readiness")
    assert urllib.request.urlopen(proxy.admin_url + "/livez", timeout=5).status == 200
    assert urllib.request.urlopen(proxy.admin_url + "/readyz", timeout=5).status == 200
    with RawClient.connect(proxy.bootstrap) as c:
        c.metadata()
    text = urllib.request.urlopen(proxy.admin_url + "/metrics", timeout=5).read().decode()
    for name in ("txnguard_frames_total", "txnguard_bytes_total", "txnguard_upstream_rtt_seconds_bucket",
                 "txnguard_connections_active", "txnguard_backpressure_paused_seconds_total"):
        assert name in text or name.replace("_total", "") in text, name
    assert 'txnguard_frames_total{api="metadata",direction="client_to_broker"} 1.0' in text

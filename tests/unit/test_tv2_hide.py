"""Transaction version 2 (KIP-890 part 2): passed through by default, hidden on request.

A Kafka 4.x Java client uses TV2 when the ApiVersions response finalizes
`transaction.version` >= 2 (TransactionManager.maybeUpdateTransactionV2Enabled); it then
caps nothing and sends Produce v12+, TxnOffsetCommit v5+, EndTxn v5+ and no
AddPartitionsToTxn. With `hide_transaction_version_2` the proxy shows level 1 and
caps those three APIs at their last TV1 versions, so the client stays on TV1.
"""

from __future__ import annotations

import datetime

from connection_playbook import (
    T0,
    Like,
    Playbook,
    api_versions_request,
    of_type,
    produce,
    response,
    steps,
    to_broker,
    to_client,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.api_versions.v4.response import (
    ApiVersion,
    ApiVersionsResponse,
    FinalizedFeatureKey,
    SupportedFeatureKey,
)
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i64

from txnguard.codecs import schemas
from txnguard.codecs.api_keys import ApiKey
from txnguard.codecs.api_versions import (
    REWRITE_HIDE_TV2,
    REWRITE_INTERSECT,
    VersionPolicy,
    advertised_range,
    rewrite,
)
from txnguard.connection.commands import Ask, PauseReading, Rewritten, Side
from txnguard.proxy.config import ConfigError, load

HIDE = VersionPolicy(hide_transaction_version_2=True)

# What Kafka 4.3.1 (one KRaft node, default features) answers, for the keys that matter here; every
# range is within what kio 0.6.5 decodes, so the default policy leaves the response untouched.
KAFKA_4_RANGES = ((0, 3, 12), (3, 0, 12), (18, 0, 4), (22, 0, 5), (24, 0, 5), (25, 0, 4), (26, 0, 5), (28, 0, 5),
                  (19, 2, 7))


def _broker(ranges=KAFKA_4_RANGES, tv_level: int | None = 2, tv_max: int = 2, epoch: int = 7):
    finalized = [FinalizedFeatureKey(name="metadata.version", max_version_level=i16(27), min_version_level=i16(27))]
    supported = [SupportedFeatureKey(name="metadata.version", min_version=i16(7), max_version=i16(27)),
                 SupportedFeatureKey(name="transaction.version", min_version=i16(0), max_version=i16(tv_max))]
    if tv_level is not None:
        finalized.append(FinalizedFeatureKey(name="transaction.version", max_version_level=i16(tv_level),
                                             min_version_level=i16(tv_level)))
    return ApiVersionsResponse(
        error_code=ErrorCode.none,
        api_keys=tuple(ApiVersion(api_key=i16(k), min_version=i16(lo), max_version=i16(hi)) for k, lo, hi in ranges),
        throttle_time=datetime.timedelta(0), supported_features=tuple(supported), finalized_features_epoch=i64(epoch),
        finalized_features=tuple(finalized))


def _ranges(body):
    return {int(e.api_key): (int(e.min_version), int(e.max_version)) for e in body.api_keys}


def _finalized(body):
    return {f.name: (int(f.min_version_level), int(f.max_version_level)) for f in body.finalized_features}


def _supported(body):
    return {f.name: (int(f.min_version), int(f.max_version)) for f in body.supported_features}


# -- pure: the rewrite -------------------------------------------------------------------------------------


def test_by_default_a_tv2_broker_answer_is_not_rewritten():
    body = _broker()
    assert rewrite(body, VersionPolicy()) == (body, None)


def test_hide_shows_transaction_version_1_and_caps_the_versions_only_tv2_clients_send():
    new, kind = rewrite(_broker(), HIDE)
    assert kind == REWRITE_HIDE_TV2
    assert _finalized(new) == {"metadata.version": (27, 27), "transaction.version": (1, 1)}
    assert _supported(new) == {"metadata.version": (7, 27), "transaction.version": (0, 1)}
    assert new.finalized_features_epoch == 7          # the broker's epoch: the client compares epochs
    ranges = _ranges(new)
    assert ranges[0] == (3, 11)    # Produce: ProduceRequest.LAST_STABLE_VERSION_BEFORE_TRANSACTION_V2
    assert ranges[28] == (0, 4)    # TxnOffsetCommit: same constant
    assert ranges[26] == (0, 4)    # EndTxn: same constant
    # AddPartitionsToTxn: clients send v3 at most (forClient), v4+ is broker-to-broker: left as it is
    assert ranges[24] == (0, 5)
    # Every other key as the broker listed it (19, CreateTopics, is a key the proxy does not name: a plain int)
    left = (ApiKey.METADATA, ApiKey.API_VERSIONS, ApiKey.INIT_PRODUCER_ID, ApiKey.ADD_OFFSETS_TO_TXN, 19)
    assert {k: ranges[k] for k in left} == {ApiKey.METADATA: (0, 12), ApiKey.API_VERSIONS: (0, 4),
                                            ApiKey.INIT_PRODUCER_ID: (0, 5), ApiKey.ADD_OFFSETS_TO_TXN: (0, 4),
                                            19: (2, 7)}


def test_hide_is_a_no_op_on_a_broker_without_tv2():
    body = _broker(ranges=((0, 3, 11), (26, 0, 4), (28, 0, 4)), tv_level=1, tv_max=1)
    assert rewrite(body, HIDE) == (body, None)
    no_feature = _broker(ranges=((0, 3, 9), (28, 0, 3)), tv_level=None, tv_max=0)   # 3.x: no transaction.version
    assert rewrite(no_feature, HIDE) == (no_feature, None)


def test_a_broker_that_supports_tv2_without_finalizing_it_gets_its_ranges_capped():
    # transaction.version finalized at 1 (an upgrade not finished) on a 4.x broker: Produce v12 is still offered.
    new, kind = rewrite(_broker(tv_level=1), HIDE)
    assert kind == REWRITE_HIDE_TV2
    assert _finalized(new)["transaction.version"] == (1, 1)
    assert _supported(new)["transaction.version"] == (0, 1)
    assert _ranges(new)[0] == (3, 11)


def test_hide_and_the_intersection_together_count_as_one_hide():
    # Metadata above kio: intersected; plus TV2: the rewrite is counted once, as the hide.
    new, kind = rewrite(_broker(ranges=((3, 0, 99), (0, 3, 12))), HIDE)
    assert kind == REWRITE_HIDE_TV2
    assert _ranges(new) == {3: (0, schemas.kio_version_range(ApiKey.METADATA)[1]), 0: (3, 11)}
    new, kind = rewrite(_broker(ranges=((3, 0, 99),), tv_level=1, tv_max=1), HIDE)
    assert _ranges(new) == {3: (0, schemas.kio_version_range(ApiKey.METADATA)[1])}
    assert kind == REWRITE_INTERSECT


def test_the_local_unsupported_version_answer_caps_the_same_apis():
    assert advertised_range(ApiKey.PRODUCE, 0, 12, HIDE) == (0, 11)
    assert advertised_range(ApiKey.TXN_OFFSET_COMMIT, 0, 5, HIDE) == (0, 4)
    assert advertised_range(ApiKey.END_TXN, 0, 5, HIDE) == (0, 4)
    assert advertised_range(ApiKey.PRODUCE, 0, 12, VersionPolicy()) == (0, 12)


def test_the_rewritten_bytes_round_trip_with_the_other_tagged_fields_kept():
    broker = _broker()
    frame = response(ApiKey.API_VERSIONS, 4, 5, broker)
    header, decoded = schemas.decode_response(memoryview(frame)[4:], ApiKey.API_VERSIONS, 4)
    new, _ = rewrite(decoded, HIDE)
    _, again = schemas.decode_response(memoryview(schemas.encode(header, new))[4:], ApiKey.API_VERSIONS, 4)
    assert again.finalized_features_epoch == 7 and _finalized(again)["transaction.version"] == (1, 1)
    assert again.zk_migration_ready is False and again.throttle_time == broker.throttle_time


# -- the connection core -------------------------------------------------------------------------------------


def test_core_passes_the_tv2_answer_as_the_brokers_bytes_by_default():
    pb = Playbook()
    pb.relays(api_versions_request(1, version=4))
    answer = response(ApiKey.API_VERSIONS, 4, 1, _broker())
    out = pb.broker_answers(answer)
    assert to_client(out) == answer
    assert of_type(out, Rewritten) == []


def test_core_with_hide_sends_tv1_and_names_the_rewrite():
    pb = Playbook()
    pb.cluster.version_policy = HIDE
    pb.relays(api_versions_request(1, version=4))
    out = pb.broker_answers(response(ApiKey.API_VERSIONS, 4, 1, _broker()))
    assert of_type(out, Rewritten) == [Rewritten(ApiKey.API_VERSIONS, "hide_transaction_version_2")]
    _, seen = schemas.decode_response(memoryview(to_client(out))[4:], ApiKey.API_VERSIONS, 4)
    assert _finalized(seen)["transaction.version"] == (1, 1)
    assert _ranges(seen)[0] == (3, 11)


def test_a_tv2_produce_passes_unverified_and_a_tv1_produce_is_verified():
    pb = Playbook()
    v12 = produce(1, [T0], version=12)         # no AddPartitionsToTxn seen: the broker adds T0 itself
    out = pb.client_sends(v12)
    assert to_broker(out) == v12 and of_type(out, Ask) == []
    v11 = produce(2, [T0], version=11)
    out = pb.client_sends(v11)
    assert steps(out) == [PauseReading(Side.CLIENT, "verification"), Like(Ask)]   # held: the proxy asks first


# -- configuration -------------------------------------------------------------------------------------------


def test_config_option_from_yaml_environment_and_its_validation(tmp_path):
    base = {"upstream": "127.0.0.1:9092"}
    assert load(None, base, environ={}).hide_transaction_version_2 is False
    assert load(None, {**base, "hide_transaction_version_2": True}, environ={}).hide_transaction_version_2
    assert load(None, base, environ={"TXNGUARD_HIDE_TRANSACTION_VERSION_2": "true"}).hide_transaction_version_2
    f = tmp_path / "c.yaml"
    f.write_text("upstream: 127.0.0.1:9092\nhide_transaction_version_2: yes\n")
    try:
        load(f, environ={})
    except ConfigError as e:
        assert "hide_transaction_version_2" in str(e)
    else:
        raise AssertionError("'yes' (YAML 1.1) must be refused: booleans are true/false")


# -- any broker answer ---------------------------------------------------------------------------------------

_range = st.tuples(st.integers(0, 20), st.integers(0, 20)).map(sorted)
_keys = st.dictionaries(st.sampled_from([0, 3, 18, 19, 22, 24, 25, 26, 28, 1234]), _range, max_size=8)
_features = st.dictionaries(st.sampled_from(["transaction.version", "metadata.version", "group.version"]), _range,
                            max_size=3)


@settings(max_examples=200, deadline=None)
@given(keys=_keys, supported=_features, finalized=_features, epoch=st.integers(-1, 10**12))
def test_hide_never_shows_tv2_never_widens_and_is_stable(keys, supported, finalized, epoch):
    body = ApiVersionsResponse(
        error_code=ErrorCode.none,
        api_keys=tuple(ApiVersion(api_key=i16(k), min_version=i16(lo), max_version=i16(hi))
                       for k, (lo, hi) in keys.items()),
        throttle_time=datetime.timedelta(0),
        supported_features=tuple(SupportedFeatureKey(name=n, min_version=i16(lo), max_version=i16(hi))
                                 for n, (lo, hi) in supported.items()),
        finalized_features_epoch=i64(epoch),
        finalized_features=tuple(FinalizedFeatureKey(name=n, min_version_level=i16(lo), max_version_level=i16(hi))
                                 for n, (lo, hi) in finalized.items()))
    new, kind = rewrite(body, HIDE)
    plain, _ = rewrite(body, VersionPolicy())
    assert new.finalized_features_epoch == epoch
    assert all(f.max_version_level <= 1 for f in new.finalized_features if f.name == "transaction.version")
    assert all(f.max_version <= 1 for f in new.supported_features if f.name == "transaction.version")
    assert [f for f in new.finalized_features if f.name != "transaction.version"] == \
        [f for f in body.finalized_features if f.name != "transaction.version"]
    got, before = _ranges(new), _ranges(plain)
    assert set(got) <= set(before)
    for k, (lo, hi) in got.items():
        assert before[k][0] <= lo <= hi <= before[k][1]
        assert hi <= {ApiKey.PRODUCE: 11, ApiKey.END_TXN: 4, ApiKey.TXN_OFFSET_COMMIT: 4}.get(k, hi)
    assert rewrite(new, HIDE)[1] is None                     # a second pass changes nothing
    assert (kind == REWRITE_HIDE_TV2) == (new != plain)
    assert (kind is None) == (new is body)

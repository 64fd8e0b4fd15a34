"""The QoS compatibility table of seed 001 (docs/COMPANION.md, "QoS compatibility"), one case per
row and side, against real Cyclone DDS: a registration the gateway would make (the Companion on
the dds backend) against an independent cyclonedds endpoint with the row's other QoS.

Row = (publisher offers, subscription requests). Side "ubrb-pub": the companion advertises with
the publisher's QoS, the independent endpoint is a reader; side "ubrb-sub": the companion
subscribes with the subscription's QoS, the independent endpoint is a writer. A compatible row
delivers (and, for durability, delivers the message written before the late side appeared
exactly when the table says "new and old"); an incompatible row delivers nothing and the
companion reports ERROR ``qos_incompatible`` naming the policy, and lists it in /diagnostics.
"""

import time

import pytest
from cyclonedds.pub import DataWriter
from cyclonedds.qos import Policy, Qos
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic
from rosbags.typesys import Stores, get_typestore

from ros_side import diag
from ros_side.companion import Companion
from tests.support import ros_idl as I

STORE = get_typestore(Stores.ROS2_HUMBLE)
BE, REL, VOL, TL = "best_effort", "reliable", "volatile", "transient_local"

# (policy, publisher offers, subscription requests, compatible, late joiner gets the old message)
# Seed 001: "Compatibility of reliability QoS policies" and "... of durability QoS policies".
TABLE = [
    ("RELIABILITY", BE, BE, True, None),
    ("RELIABILITY", BE, REL, False, None),
    ("RELIABILITY", REL, BE, True, None),
    ("RELIABILITY", REL, REL, True, None),
    ("DURABILITY", VOL, VOL, True, False),    # new messages only
    ("DURABILITY", VOL, TL, False, None),     # no communication
    ("DURABILITY", TL, VOL, True, False),     # new messages only
    ("DURABILITY", TL, TL, True, True),       # new and old messages
]


def ubrb_qos(policy, value):
    # The other policy at ROS 2's default (reliable, volatile), as in the seed's tables.
    q = {"reliability": REL, "durability": VOL, "depth": 10}
    q["reliability" if policy == "RELIABILITY" else "durability"] = value
    return q


def dds_qos(q):
    return Qos(Policy.Reliability.Reliable(10 ** 9) if q["reliability"] == REL
               else Policy.Reliability.BestEffort,
               Policy.Durability.TransientLocal if q["durability"] == TL
               else Policy.Durability.Volatile,
               Policy.History.KeepLast(q["depth"]))


def cdr(text):
    return bytes(STORE.serialize_cdr(STORE.types["std_msgs/msg/String"](data=text),
                                     "std_msgs/msg/String"))


@pytest.fixture
def comp(dds_backend, sink):
    c = Companion(dds_backend, sink, max_message=1 << 20, diagnostics_period_ms=0)
    yield c
    c.close(close_backend=False)


def pump(comp, seconds, until=lambda: False):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        comp.poll(int(time.monotonic() * 1000))
        if until():
            return True
        time.sleep(0.01)
    return until()


@pytest.mark.parametrize("side", ["ubrb-pub", "ubrb-sub"])
@pytest.mark.parametrize("policy,pub,sub,compatible,old", TABLE,
                         ids=["%s-%s-%s" % (r[0].lower(), r[1], r[2]) for r in TABLE])
def test_qos_table_row(comp, sink, dp, side, policy, pub, sub, compatible, old):
    topic = "/qos_table/%s_%s_%s_%s" % (side.replace("-", "_"), policy.lower(), pub, sub)
    pq, sq = ubrb_qos(policy, pub), ubrb_qos(policy, sub)
    slot = 5
    got = []
    if side == "ubrb-pub":
        comp.advertise(slot, topic, "std_msgs/msg/String", pq)
        comp.publish(slot, cdr("old"), 0, len(cdr("old")), pq["reliability"] == REL)
        r = DataReader(dp, Topic(dp, "rt" + topic, I.String), qos=dds_qos(sq))

        def matched():
            return r.get_subscription_matched_status().current_count > 0

        def write(text):
            comp.publish(slot, cdr(text), 0, len(cdr(text)), pq["reliability"] == REL)

        def received():
            got.extend(s.data for s in r.take(N=100))
            return got
    else:
        w = DataWriter(dp, Topic(dp, "rt" + topic, I.String), qos=dds_qos(pq))
        w.write(I.String(data="old"))
        comp.subscribe(slot, topic, "std_msgs/msg/String", sq)

        def matched():
            return w.get_publication_matched_status().current_count > 0

        def write(text):
            w.write(I.String(data=text))

        def received():
            got[:] = [STORE.deserialize_cdr(m, "std_msgs/msg/String").data
                      for m in sink.messages(slot)]
            return got

    assert [c[3] for c in sink.of("result")] == [None]   # registered either way

    def incompatible():
        return [e for e in sink.of("error") if e[3] == "qos_incompatible"]

    if compatible:
        assert pump(comp, 10, matched), "no match"
        # best effort may lose a sample: write until one arrives
        for _ in range(50):
            write("new")
            if pump(comp, 0.1, lambda: "new" in received()):
                break
        assert "new" in received()
        if old is not None:
            assert ("old" in got) == old, got
        assert not incompatible()
        assert comp.diagnostics()["qos_incompatible_topics"] == ""
    else:
        assert pump(comp, 10, incompatible), "no qos_incompatible"
        kind, s, code, message = incompatible()[0][1:]
        assert (kind, s) == ("pub" if side == "ubrb-pub" else "sub", slot)
        assert policy in message and topic in message
        for _ in range(5):
            write("new")
        pump(comp, 0.3)
        assert not matched() and received() == []
        d = comp.diagnostics()
        assert d["qos_incompatible"] == 1
        assert "%s (%s, %s)" % (topic, kind, policy) in d["qos_incompatible_topics"]
        level, _, what, _, _ = comp._diag_statuses()[0]
        assert level == diag.WARN and what.startswith("QoS incompatible: ")

"""Issue 21, item 4, the companion's part on a scripted backend: a released reliable writer is
destroyed only once the backend says its readers acknowledged everything it wrote, or DRAIN_MS
after the release; the loop only ever asks (timeout 0). The real thing, through the gateway and
both backends: test_closing_client.py."""

from ros_side.companion import (CLOSE_DRAIN_MS, DRAIN_CHECK_MS, DRAIN_MAX, DRAIN_MS,
                                 SESSION_LINGER_MS,
                                 Companion)
from tests.support.fake_backend import FakeBackend
from tests.support.qos import QOS_R

BE = {"reliability": "best_effort", "durability": "volatile", "depth": 1}
T = "std_msgs/msg/String"
DATA = b"\x00\x01\x00\x00\x03\x00\x00\x00hi\x00\x00"


class AckingBackend(FakeBackend):
    """``acked`` answers from ``unacked`` (the handles not acknowledged yet) and records the
    timeout it was asked with."""

    def __init__(self):
        FakeBackend.__init__(self)
        self.unacked = set()
        self.waits = []

    def publish(self, h, data):
        FakeBackend.publish(self, h, data)
        self.unacked.add(h)

    def acked(self, h, timeout_s):
        assert h not in self.destroyed, "asked about a destroyed writer"
        self.waits.append(timeout_s)
        return h not in self.unacked


def advertised(sink, qos=QOS_R, topic="/a"):
    b = AckingBackend()
    c = Companion(b, sink, diagnostics_period_ms=0, linger_ms=0)  # (no reuse: a release goes)
    c.poll(1000)
    c.advertise(1, topic, T, qos)
    return b, c, b.created[-1]


def test_a_released_writer_waits_for_its_readers_acknowledgement(sink):
    b, c, h = advertised(sink)
    c.publish(1, DATA, 0, len(DATA), True)
    c.unadvertise(1)
    c.poll(1100)
    assert h not in b.destroyed                     # its sample is not acknowledged yet
    assert c.diagnostics()["writers_draining"] == 1
    assert c.history_used == len(DATA)              # DDS still holds it: still charged
    b.unacked.discard(h)
    c.poll(1200)
    assert b.destroyed == [h]
    assert set(b.waits) == {0}                      # the loop never waited
    d = c.diagnostics()
    assert (d["writers_drained"], d["drain_timeouts"], d["writers_draining"]) == (1, 0, 0)
    assert c.history_used == 0


def test_a_reader_that_never_acknowledges_holds_it_drain_ms_no_longer(sink):
    b, c, h = advertised(sink)
    c.publish(1, DATA, 0, len(DATA), True)
    c.unadvertise(1)                                # at 1000
    c.poll(1000 + DRAIN_MS - 1)
    assert h not in b.destroyed
    c.poll(1000 + DRAIN_MS - 1 + DRAIN_CHECK_MS)
    assert b.destroyed == [h]
    assert c.diagnostics()["drain_timeouts"] == 1
    assert c.history_used == 0


def test_nothing_to_wait_for_is_destroyed_at_once(sink):
    b, c, h = advertised(sink)                      # reliable, nothing published
    c.unadvertise(1)
    assert b.destroyed == [h]
    b, c, h = advertised(sink, BE)                  # best effort: no acknowledgements
    c.publish(1, DATA, 0, len(DATA), False)
    c.unadvertise(1)
    assert b.destroyed == [h]
    b, c, h = advertised(sink)                      # acknowledged already
    c.publish(1, DATA, 0, len(DATA), True)
    b.unacked.discard(h)
    c.unadvertise(1)
    assert b.destroyed == [h]


def test_the_topic_can_be_advertised_again_while_the_old_writer_drains(sink):
    b, c, old = advertised(sink)
    c.publish(1, DATA, 0, len(DATA), True)
    c.unadvertise(1)
    c.advertise(2, "/a", T, QOS_R)
    new = b.created[-1]
    assert new != old and sink.results()[-1] == ("pub", 2, None)
    c.publish(2, DATA, 0, len(DATA), True)
    assert b.published[-1] == ("/a", DATA)
    b.unacked.discard(old)
    c.poll(1100)
    assert b.destroyed == [old]


def test_a_session_reset_drains_too_and_close_waits_for_what_is_left(sink):
    b, c, h = advertised(sink)
    c.publish(1, DATA, 0, len(DATA), True)
    c.reset()                                       # the gateway's session ended for good
    assert h not in b.destroyed
    c.close()
    assert b.destroyed == [h]
    assert 0 < b.waits[-1] <= CLOSE_DRAIN_MS / 1000.0  # the loop is over: close may wait


def test_registration_churn_keeps_at_most_drain_max_released_writers(sink):
    b = AckingBackend()
    c = Companion(b, sink, diagnostics_period_ms=0, linger_ms=0)  # (no reuse: a release goes)
    c.poll(1000)
    for i in range(DRAIN_MAX + 3):
        c.advertise(i, "/churn%d" % i, T, QOS_R)
        c.publish(i, DATA, 0, len(DATA), True)
        c.unadvertise(i)
    assert c.diagnostics()["writers_draining"] == DRAIN_MAX
    assert b.destroyed == b.created[:3]             # the oldest went
    assert c.diagnostics()["drain_timeouts"] == 3


def test_the_topic_registered_again_with_another_type_ends_the_drain(sink):
    b, c, old = advertised(sink)
    c.publish(1, DATA, 0, len(DATA), True)
    c.unadvertise(1)
    c.subscribe(3, "/a", "std_msgs/msg/Int32", QOS_R)   # DDS: one type per topic
    assert b.destroyed == [old]
    assert sink.results()[-1] == ("sub", 3, None)


def test_a_lingering_writer_drains_when_its_linger_ends(sink):
    # a released volatile writer first lingers for reuse (registration churn); its samples are
    # safe meanwhile, and when it finally goes it still waits for its readers
    b = AckingBackend()
    c = Companion(b, sink, diagnostics_period_ms=0, linger_ms=250)
    c.poll(1000)
    c.advertise(1, "/a", T, QOS_R)
    h = b.created[-1]
    c.publish(1, DATA, 0, len(DATA), True)
    c.unadvertise(1)
    c.poll(1100)
    assert h not in b.destroyed and c.diagnostics()["entities_lingering"] == 1
    c.poll(1400)                                    # linger over, not acknowledged: drains
    assert h not in b.destroyed and c.diagnostics()["writers_draining"] == 1
    b.unacked.discard(h)
    c.poll(1400 + DRAIN_CHECK_MS)
    assert b.destroyed == [h]


def test_a_new_gateway_session_takes_the_writer_its_readers_matched(sink):
    # A gateway's new session (a re-handshake, a restart) registers its topics again at once and
    # re-sends the PUBLISHes the old companion session had not acknowledged (ubrb_keep). They
    # must go to the writer the readers already matched: a new writer hands a volatile reader
    # nothing written before discovery matched them (before: the reset deleted every writer)
    b = AckingBackend()
    c = Companion(b, sink, diagnostics_period_ms=0)
    c.poll(1000)
    c.advertise(1, "/a", T, QOS_R)
    c.subscribe(2, "/b", T, QOS_R)
    pub, sub = b.created
    c.publish(1, DATA, 0, len(DATA), True)
    c.reset()                                       # the gateway's new session
    c.poll(1000 + SESSION_LINGER_MS - 1)
    assert b.destroyed == []
    c.advertise(1, "/a", T, QOS_R)                  # its registrations come again
    c.subscribe(2, "/b", T, QOS_R)
    c.publish(1, DATA, 0, len(DATA), True)          # a kept PUBLISH re-sent
    assert b.created == [pub, sub] and b.published == [("/a", DATA), ("/a", DATA)]
    assert c.stats["entities_reused"] == 2


def test_after_a_session_reset_what_is_not_taken_again_goes(sink):
    b = AckingBackend()
    c = Companion(b, sink, diagnostics_period_ms=0)
    c.poll(1000)
    c.subscribe(2, "/b", T, QOS_R)
    c.reset()
    c.poll(1000 + SESSION_LINGER_MS)                # no new session took it
    assert b.destroyed == b.created
    c.close()                                       # ... and close leaves nothing either
    c2 = Companion(AckingBackend(), sink, diagnostics_period_ms=0)
    c2.poll(1000)
    c2.subscribe(2, "/b", T, QOS_R)
    c2.close()
    assert c2.backend.destroyed == c2.backend.created

"""The latched-state store (ros_side/latched.py) with the scripted backend: what a restarted
companion publishes again, under which identity, for how long, within which bounds, and a
damaged file. The same through real processes and a real ``kill -9``: test_latched_restart.py."""

import logging
import os

import ubrb_min as U
from ros_helpers import RecordingSink
from ros_side.companion import Companion
from ros_side.latched import LatchedStore, default_path
from tests.support.fake_backend import FakeBackend

LATCHED = {"reliability": "reliable", "durability": "transient_local", "depth": 3}
VOLATILE = {"reliability": "reliable", "durability": "volatile", "depth": 3}
S = "std_msgs/msg/String"


class GenSink(RecordingSink):
    """A sink that knows the gateway's registration generations, as the link end does."""

    def __init__(self, gens=None):
        RecordingSink.__init__(self)
        self.gens = dict(gens or {})

    def registration_gen(self, kind, slot):
        return self.gens.get((kind, slot), 0)


def cdr(i):
    return b"\x00\x01\x00\x00" + b"m%03d" % i


def companion(path, gens, **kw):
    store = LatchedStore(str(path), claim_window_ms=kw.pop("window", 10000), write_min_ms=0,
                         **kw)
    c = Companion(FakeBackend(), GenSink(gens), diagnostics_period_ms=0, latched=store)
    return c, store


def restart(c, path, gens, **kw):
    """The old companion is gone (its file written), a new one reads it and the gateway's
    link comes up."""
    c.latched.close()
    c2, store = companion(path, gens, **kw)
    c2.gateway_up()
    c2.poll(0)
    return c2, store


def published(c, topic):
    return [d for t, d in c.backend.published if t == topic]


def test_the_same_registration_gets_its_last_depth_samples_back(tmp_path):
    path = tmp_path / "s.latched"
    c, _ = companion(path, {("pub", 1): 7, ("pub", 2): 8})
    c.advertise(1, "/latched", S, LATCHED)
    c.advertise(2, "/volatile", S, VOLATILE)
    for i in range(5):
        c.publish(1, cdr(i), 0, 8, True)
        c.publish(2, cdr(i), 0, 8, True)
    c.poll(0)
    c2, store = restart(c, path, {("pub", 1): 7, ("pub", 2): 8})
    assert store.counters()["latched_loaded"] == 3       # the volatile topic kept nothing
    c2.advertise(2, "/volatile", S, VOLATILE)
    c2.advertise(1, "/latched", S, LATCHED)
    assert published(c2, "/latched") == [cdr(2), cdr(3), cdr(4)]   # oldest first
    assert published(c2, "/volatile") == []
    c2.publish(1, cdr(5), 0, 8, True)                   # and it goes on from there
    c3, _ = restart(c2, path, {("pub", 1): 7})
    c3.advertise(1, "/latched", S, LATCHED)
    assert published(c3, "/latched") == [cdr(3), cdr(4), cdr(5)]


def test_another_identity_gets_nothing(tmp_path):
    """A restarted gateway (another generation), another topic, type or QoS on the slot: the
    old samples are not resurrected, and they are forgotten."""
    path = tmp_path / "s.latched"
    c, _ = companion(path, {("pub", 1): 7})
    c.advertise(1, "/latched", S, LATCHED)
    c.publish(1, cdr(1), 0, 8, True)
    c.poll(0)
    for gens, topic, qos in [({("pub", 1): 9}, "/latched", LATCHED),
                             ({("pub", 1): 7}, "/other", LATCHED),
                             ({("pub", 1): 7}, "/latched", dict(LATCHED, depth=4))]:
        c2, store = restart(c, path, {("pub", 1): 7})
        c2.sink.gens = gens
        c2.advertise(1, topic, S, qos)
        assert published(c2, topic) == []
        c2.poll(1)
        c2.latched.close()
        assert not os.path.exists(path)         # forgotten
        c, _ = companion(path, {("pub", 1): 7})
        c.advertise(1, "/latched", S, LATCHED)
        c.publish(1, cdr(1), 0, 8, True)
        c.poll(0)


def test_a_released_registration_is_forgotten(tmp_path):
    """UNADV (also what the gateway sends on ros_up for a release it made while the companion
    was away) and a refused registration drop the samples; the file goes with the last one."""
    path = tmp_path / "s.latched"
    c, _ = companion(path, {("pub", 1): 7, ("pub", 2): 8})
    c.advertise(1, "/latched", S, LATCHED)
    c.advertise(2, "/other", S, LATCHED)
    c.publish(1, cdr(1), 0, 8, True)
    c.publish(2, cdr(2), 0, 8, True)
    c.poll(0)
    c2, store = restart(c, path, {("pub", 1): 7, ("pub", 2): 8})
    c2.unadvertise(1)
    c2.backend.fail = RuntimeError("no such type")      # slot 2's registration is refused
    c2.advertise(2, "/other", S, LATCHED)
    assert c2.sink.results()[-1] == ("pub", 2, "unknown_type")
    c2.backend.fail = None
    c2.advertise(1, "/latched", S, LATCHED)
    c2.advertise(2, "/other", S, LATCHED)
    assert c2.backend.published == []
    c2.poll(1)
    c2.latched.close()
    assert not os.path.exists(path)


def test_entries_the_gateway_does_not_hand_over_expire(tmp_path):
    path = tmp_path / "s.latched"
    c, _ = companion(path, {("pub", 1): 7, ("pub", 2): 8})
    c.advertise(1, "/a", S, LATCHED)
    c.advertise(2, "/b", S, LATCHED)
    c.publish(1, cdr(1), 0, 8, True)
    c.publish(2, cdr(2), 0, 8, True)
    c.poll(0)
    c2, store = restart(c, path, {("pub", 1): 7, ("pub", 2): 8}, window=500)
    c2.advertise(1, "/a", S, LATCHED)                   # its client is still there
    c2.poll(499)
    assert store.counters()["latched_topics"] == 2
    c2.poll(500)                                        # /b's client has gone
    assert store.counters()["latched_topics"] == 1
    c2.advertise(2, "/b", S, LATCHED)
    assert published(c2, "/b") == []
    # a session reset (a new gateway epoch, or --release-after) keeps the samples for the
    # registrations coming back
    c2.reset()
    c2.gateway_up()
    c2.poll(1000)
    c2.advertise(1, "/a", S, LATCHED)
    assert published(c2, "/a") == [cdr(1), cdr(1)]


def test_bounded_by_depth_and_the_total_cap(tmp_path):
    path = tmp_path / "s.latched"
    store = LatchedStore(str(path), max_bytes=100, write_min_ms=0)
    c = Companion(FakeBackend(), GenSink({("pub", 1): 1, ("pub", 2): 2}), diagnostics_period_ms=0,
                  latched=store)
    c.advertise(1, "/a", S, dict(LATCHED, depth=1000))
    c.advertise(2, "/b", S, dict(LATCHED, depth=1000))
    for _ in range(20):
        c.publish(1, b"\x00\x01\x00\x00" + b"a" * 36, 0, 40, True)
    c.publish(2, b"\x00\x01\x00\x00" + b"b" * 36, 0, 40, True)
    c.publish(1, b"\x00\x01\x00\x00" + b"a" * 196, 0, 200, True)   # larger than the cap: not kept
    assert store.total <= 100
    assert [len(e.samples) for e in store.entries.values()] == [1, 1]   # /a's oldest went first
    c.poll(0)
    store.close()
    assert os.path.getsize(path) < 100 + 400


def test_a_damaged_file_is_one_line_and_a_fresh_start(tmp_path, caplog):
    path = tmp_path / "s.latched"
    c, _ = companion(path, {("pub", 1): 7})
    c.advertise(1, "/a", S, LATCHED)
    c.publish(1, cdr(1), 0, 8, True)
    c.poll(0)
    c.latched.close()
    raw = path.read_bytes()
    for bad in (raw[:-9], raw[:20] + b"X" + raw[21:], b"something else", raw + b"\0"):
        path.write_bytes(bad)
        caplog.clear()
        with caplog.at_level(logging.WARNING, "ros_side.latched"):
            store = LatchedStore(str(path))
        assert store.entries == {} and len(caplog.records) == 1, caplog.text
        assert "unusable" in caplog.text and "Traceback" not in caplog.text


def test_the_tf_static_union_comes_back_whole(tmp_path):
    """The /tf_static union (TfUnion) is what is kept: restored, then merged with what follows."""
    from tests.support.tf_worlds import children, tf_cdr
    path = tmp_path / "s.latched"
    tf = "tf2_msgs/msg/TFMessage"
    q = dict(LATCHED, depth=1)
    c, _ = companion(path, {("pub", 1): 3})
    c.advertise(1, "/tf_static", tf, q)
    for frames in ([("map", "a", 1.0)], [("map", "b", 2.0)]):
        data = tf_cdr(frames)
        c.publish(1, data, 0, len(data), True)
    c.poll(0)
    c2, _ = restart(c, path, {("pub", 1): 3})
    c2.advertise(1, "/tf_static", tf, q)
    assert children(published(c2, "/tf_static")[-1]) == {"a": 1.0, "b": 2.0}
    data = tf_cdr([("map", "c", 3.0)])
    c2.publish(1, data, 0, len(data), True)
    assert children(published(c2, "/tf_static")[-1]) == {"a": 1.0, "b": 2.0, "c": 3.0}


def test_default_path_one_file_per_link(monkeypatch, tmp_path):
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    a = default_path("udp://127.0.0.1:8269")
    assert a == str(tmp_path / "ubrb" / "ros_side-udp_127.0.0.1_8269.latched")
    assert default_path("serial:/dev/ttyACM0") != default_path("serial:/dev/ttyACM1")
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/ubrb-companion")   # systemd's
    assert default_path("udp://0.0.0.0:8269") == \
        "/var/lib/ubrb-companion/ros_side-udp_0.0.0.0_8269.latched"


def test_a_restarted_gateways_generations_differ():
    """The gateway's first generation is its link epoch (random per process): the registrations
    of a restarted gateway do not pass for those whose samples the companion kept."""
    gens = []
    for epoch in (0x1234567, 0x2345678):
        s = U.LinkSession(None, epoch, gateway=True)
        port = U.LinkRosPort(s)
        port.advertise(1, "/tf_static", "tf2_msgs/msg/TFMessage", LATCHED)
        gens.append(-port.gens[2])
    assert gens[0] != gens[1]

"""Unit tests of the sans-IO ClientProtocol with injected time (no sockets, no sleeps)."""
import logging

import client_wire as W
import pytest

from ubrb_client import frames as F
from ubrb_client import protocol as P
from ubrb_client.protocol import ClientProtocol

CDR = b"\x00\x01\x00\x00" + b"abcd"


def cdr(i: int) -> bytes:
    return b"\x00\x01\x00\x00" + i.to_bytes(4, "little")


def connect(p: ClientProtocol, now=0.0):
    if p.state == P.IDLE:
        p.start(now)
    assert p.connect_due(now)
    p.connection_started(now)
    p.connection_made(now)
    return W.parse(p.drain())


def setup_registrations(p):
    a = p.advertise("/a", "std_msgs/msg/String")
    b = p.advertise("/b", "std_msgs/msg/String", "best_effort")
    s = p.subscribe("/c", "std_msgs/msg/String", "sensor_data")
    c = p.advertise("/d", "std_msgs/msg/String")
    t = p.subscribe("/e", "std_msgs/msg/String")
    return a, b, c, s, t


# ------------------------------------------------------------------------------- framing
def test_frame_header_layout():
    f = F.encode_frame(F.PING)
    assert f == b"UBRB\x01\x0a\x00\x00\x00\x00\x00\x00"
    f = F.encode_data_frame(F.PUBLISH, 7, CDR)
    assert f[:12] == b"UBRB\x01\x05\x00\x00" + (4 + len(CDR)).to_bytes(4, "little")
    assert f[12:16] == (7).to_bytes(4, "little") and f[16:] == CDR


def test_decoder_split_and_coalesced():
    stream = F.encode_frame(F.PONG) + W.message(3, CDR) + W.hello_ack()
    dec = F.FrameDecoder()
    got = []
    for i in range(len(stream)):
        got += dec.feed(stream[i:i + 1])
    assert [op for op, _ in got] == [F.PONG, F.MESSAGE, F.HELLO_ACK]
    assert [op for op, _ in F.FrameDecoder().feed(stream)] == [F.PONG, F.MESSAGE, F.HELLO_ACK]


@pytest.mark.parametrize("hdr", [b"UBRX\x01\x08\x00\x00\x00\x00\x00\x00",
                                 b"UBRB\x02\x08\x00\x00\x00\x00\x00\x00",
                                 b"UBRB\x01\x08\x00\x00\xff\xff\xff\xff"])
def test_decoder_rejects_bad_header_before_payload(hdr):
    with pytest.raises(F.MalformedHeader):
        F.FrameDecoder().feed(hdr)  # no payload bytes needed


def test_flags_ignored_by_receiver():
    f = bytearray(W.message(1, CDR))
    f[6:8] = b"\xff\xff"
    assert F.FrameDecoder().feed(bytes(f))[0][0] == F.MESSAGE


# ------------------------------------------------------------------------------ handshake
def test_hello_then_advertise_then_subscribe_without_waiting_for_ack():
    p = ClientProtocol("ue")
    a, b, c, s, t = setup_registrations(p)
    frames = connect(p)
    assert [n for n, _ in frames] == ["HELLO", "ADVERTISE", "ADVERTISE", "ADVERTISE",
                                      "SUBSCRIBE", "SUBSCRIBE"]
    assert frames[0][1] == {"protocol": 1, "client": "ue"}
    assert [f[1]["id"] for f in frames[1:4]] == [a, b, c] == [1, 2, 3]
    assert [f[1]["id"] for f in frames[4:]] == [s, t] == [1, 2]
    assert frames[2][1] == {"id": 2, "topic": "/b", "type": "std_msgs/msg/String",
                            "qos": {"reliability": "best_effort", "durability": "volatile",
                                    "depth": 10}}
    assert frames[4][1]["qos"] == {"reliability": "best_effort", "durability": "volatile",
                                   "depth": 5}
    # live data follows immediately, no HELLO_ACK yet
    assert p.publish(a, CDR)
    assert W.parse(p.drain()) == [("PUBLISH", (a, CDR))]
    evs = p.data_received(W.hello_ack(), 0.1)
    assert isinstance(evs[0], P.HelloAck) and p.server_info["server"] == "fake/0"


def test_registration_while_connected_is_sent_at_once():
    p = ClientProtocol()
    connect(p)
    pid = p.advertise("/x", "std_msgs/msg/String")
    sid = p.subscribe("/y", "std_msgs/msg/String")
    p.unsubscribe(sid)
    p.unadvertise(pid)
    assert W.parse(p.drain()) == [
        ("ADVERTISE", {"id": 1, "topic": "/x", "type": "std_msgs/msg/String",
                       "qos": {"reliability": "reliable", "durability": "volatile", "depth": 10}}),
        ("SUBSCRIBE", {"id": 1, "topic": "/y", "type": "std_msgs/msg/String",
                       "qos": {"reliability": "reliable", "durability": "volatile", "depth": 10}}),
        ("UNSUBSCRIBE", {"id": 1}), ("UNADVERTISE", {"id": 1})]


def test_ids_never_reused():
    p = ClientProtocol()
    a = p.advertise("/a", "std_msgs/msg/String")
    p.unadvertise(a)
    b = p.advertise("/a", "std_msgs/msg/String")
    s = p.subscribe("/a", "std_msgs/msg/String")
    p.unsubscribe(s)
    t = p.subscribe("/a", "std_msgs/msg/String")
    assert (a, b, s, t) == (1, 2, 1, 2)
    frames = connect(p)
    assert [(n, f["id"]) for n, f in frames[1:]] == [("ADVERTISE", 2), ("SUBSCRIBE", 2)]


# ---------------------------------------------------------------------------------- timers
def test_ping_every_2s():
    p = ClientProtocol()
    connect(p, 100.0)
    pings = []
    t = 100.0
    while t < 109.0:
        t = round(t + 0.1, 3)
        p.tick(t)
        p.data_received(F.encode_frame(F.PONG), t)  # keep the session alive
        if "PING" in W.ops(p.drain()):
            pings.append(t)
    assert pings == [102.0, 104.0, 106.0, 108.0]
    assert p.next_deadline() == pytest.approx(110.0)


def test_hello_again_every_interval_when_asked():
    # echo / hz ask the bridge again and again whether a ROS side is behind it: every HELLO gets
    # a HELLO_ACK of the bridge's present state (docs/PROTOCOL.md, Sessions)
    p = ClientProtocol(hello_interval=1.0)
    assert [n for n, _ in connect(p, 100.0)] == ["HELLO"]
    sent = []
    t = 100.0
    while t < 103.5:
        t = round(t + 0.1, 3)
        p.tick(t)
        if t == 101.2:
            evs = p.data_received(F.encode_json_frame(F.HELLO_ACK, {
                "protocol": 1, "server": "fake/0", "ros_distro": "unknown"}), t)
            assert isinstance(evs[0], P.HelloAck) and p.server_info["ros_distro"] == "unknown"
        if t == 102.3:
            p.data_received(W.hello_ack(), t)
            assert p.server_info["ros_distro"] == "humble"  # the newest answer is the state
        sent += [(t, op) for op in W.ops(p.drain()) if op == "HELLO"]
    assert sent == [(101.0, "HELLO"), (102.0, "HELLO"), (103.0, "HELLO")]
    assert p.next_deadline() == pytest.approx(104.0)
    p.connection_lost(103.5)
    assert p.next_deadline() == pytest.approx(105.5)   # the reconnect, not a HELLO
    assert W.ops(p.drain()) == []


def test_hello_once_per_connection_by_default():
    p = ClientProtocol()
    assert [n for n, _ in connect(p, 0.0)] == ["HELLO"]
    for t in (1.0, 2.5, 5.0, 9.0):
        p.tick(t)
        assert "HELLO" not in W.ops(p.drain())


def test_pong_answers_bridge_ping():
    p = ClientProtocol()
    connect(p)
    evs = p.data_received(F.encode_frame(F.PING), 0.5)
    assert isinstance(evs[0], P.PingReceived)
    assert W.ops(p.drain()) == ["PONG"]


def test_reconnect_after_10s_of_silence():
    p = ClientProtocol()
    connect(p, 0.0)
    p.data_received(W.hello_ack(), 1.0)
    p.tick(10.9)
    assert p.state == P.CONNECTED          # last byte at 1.0
    p.tick(11.0)
    assert p.state == P.WAITING and p.last_disconnect_reason == "idle timeout"
    assert not p.connect_due(12.9)
    assert p.connect_due(13.0)             # retry after the reconnect interval


def test_retry_interval_and_attempt_timeout():
    p = ClientProtocol(reconnect_interval=2.0, attempt_timeout=3.0)
    p.start(0.0)
    assert p.connect_due(0.0)              # first attempt at once
    p.connection_started(0.0)
    assert p.next_deadline() == 3.0
    p.tick(2.99)
    assert p.state == P.CONNECTING
    p.tick(3.0)                            # attempt lasted 3 s: give up
    assert p.state == P.WAITING and p.last_disconnect_reason == "connect timeout"
    assert not p.connect_due(4.99) and p.connect_due(5.0)
    p.connection_started(5.0)
    p.connection_failed(5.01, "refused")   # immediate refusal
    assert not p.connect_due(7.0) and p.connect_due(7.01)
    q = ClientProtocol(reconnect_interval=0.5)
    q.start(0)
    q.connection_started(0)
    q.connection_failed(0.1)
    assert q.connect_due(0.6)
    assert p.stats.connect_attempts == 2 and p.stats.connect_failures == 2


def test_close_stops_retrying():
    p = ClientProtocol()
    connect(p)
    p.close()
    assert p.state == P.CLOSED
    assert not p.connect_due(1e9) and p.next_deadline() is None
    assert p.pending_output().nbytes == 0


# -------------------------------------------------------------------------- reconnection
def test_same_ids_and_order_after_reconnect_then_queued_reliable_then_live():
    p = ClientProtocol()
    a, b, c, _s, _t = setup_registrations(p)
    first = connect(p, 0.0)
    p.connection_lost(1.0, "reset")
    assert p.publish(a, cdr(1)) and p.publish(c, cdr(2)) and p.publish(a, cdr(3))
    assert not p.publish(b, cdr(4))        # best-effort without a session: dropped
    assert p.stats.dropped_best_effort_no_session == 1
    p.connection_started(3.0)
    p.connection_made(3.0)
    p.publish(b, cdr(5))                   # live data after the replay
    p.publish(a, cdr(6))
    second = W.parse(p.drain())
    n = len(first)
    assert second[:n] == first             # identical HELLO + registrations, same ids
    assert second[n:] == [("PUBLISH", (a, cdr(1))), ("PUBLISH", (c, cdr(2))),
                          ("PUBLISH", (a, cdr(3))), ("PUBLISH", (a, cdr(6))),
                          ("PUBLISH", (b, cdr(5)))]
    # and nothing is replayed a second time
    p.connection_lost(4.0)
    p.connection_started(6.0)
    p.connection_made(6.0)
    assert W.parse(p.drain()) == first


def test_reliable_queued_before_first_connection():
    p = ClientProtocol()
    a = p.advertise("/a", "std_msgs/msg/String")
    p.publish(a, cdr(1))
    frames = connect(p)
    assert [n for n, _ in frames] == ["HELLO", "ADVERTISE", "PUBLISH"]


def test_partially_written_reliable_frame_is_requeued_written_ones_are_not():
    p = ClientProtocol(chunk_size=1)       # one frame per chunk
    a = p.advertise("/a", "std_msgs/msg/String")
    connect(p)
    for i in range(3):
        p.publish(a, cdr(i))
    mv = p.pending_output()                # frame 0: written completely
    p.output_sent(len(mv))
    mv = p.pending_output()                # frame 1: only half written
    p.output_sent(len(mv) // 2)
    p.connection_lost(1.0)
    assert p.stats.requeued_reliable == 1
    p.connection_started(3.0)
    p.connection_made(3.0)
    frames = W.parse(p.drain())
    assert [f[1] for f in frames if f[0] == "PUBLISH"] == [(a, cdr(1)), (a, cdr(2))]


def test_reliable_queue_bound():
    frame_len = len(F.encode_data_frame(F.PUBLISH, 1, cdr(0)))
    p = ClientProtocol(max_queued_bytes=3 * frame_len)
    a = p.advertise("/a", "std_msgs/msg/String")
    p.start(0)
    results = [p.publish(a, cdr(i)) for i in range(5)]
    assert results == [True, True, True, False, False]
    assert p.queued_bytes == 3 * frame_len
    assert p.stats.dropped_reliable_queue_full == 2
    frames = connect(p)
    assert [f[1] for f in frames if f[0] == "PUBLISH"] == [(a, cdr(0)), (a, cdr(1)), (a, cdr(2))]
    assert p.queued_bytes == 0
    assert p.publish(a, cdr(9))            # room again


def test_unadvertised_publisher_queue_dropped():
    p = ClientProtocol()
    a = p.advertise("/a", "std_msgs/msg/String")
    b = p.advertise("/b", "std_msgs/msg/String")
    p.publish(a, cdr(1))
    p.publish(b, cdr(2))
    p.unadvertise(a)
    frames = connect(p)
    assert [n for n, _ in frames] == ["HELLO", "ADVERTISE", "PUBLISH"]
    assert frames[2][1] == (b, cdr(2))
    with pytest.raises(KeyError):
        p.publish(a, cdr(3))


# ---------------------------------------------------------------------------- best effort
def test_best_effort_keeps_only_newest_pending():
    p = ClientProtocol()
    a = p.advertise("/a", "std_msgs/msg/String", "best_effort")
    b = p.advertise("/b", "std_msgs/msg/String", "best_effort")
    connect(p)
    for i in range(5):
        p.publish(a, cdr(i))
    p.publish(b, cdr(10))
    assert p.stats.dropped_best_effort_replaced == 4
    assert W.parse(p.drain()) == [("PUBLISH", (a, cdr(4))), ("PUBLISH", (b, cdr(10)))]


def test_best_effort_pending_dropped_when_session_ends():
    p = ClientProtocol()
    a = p.advertise("/a", "std_msgs/msg/String", "best_effort")
    connect(p)
    p.publish(a, cdr(1))
    p.connection_lost(1.0)
    p.connection_started(3.0)
    p.connection_made(3.0)
    assert "PUBLISH" not in W.ops(p.drain())


# ------------------------------------------------------------------------------ SUB_COUNT
def test_sub_count_zero_skips_encoding_unknown_publishes():
    p = ClientProtocol()
    a = p.advertise("/a", "std_msgs/msg/String")
    b = p.advertise("/b", "std_msgs/msg/String")
    connect(p)
    calls = []

    def lazy():
        calls.append(1)
        return CDR

    assert p.wants_data(a) and p.subscriber_count(a) is None   # unknown: publish normally
    assert p.publish(a, lazy) and calls == [1]
    evs = p.data_received(W.sub_count({a: 0, b: 2}), 0.1)
    assert isinstance(evs[0], P.SubCount) and evs[0].counts == {a: 0, b: 2}
    assert not p.wants_data(a) and p.wants_data(b)
    assert not p.publish(a, lazy) and calls == [1]            # not even encoded
    assert p.stats.skipped_no_subscribers == 1
    assert p.publish(a, lazy, force=True) and calls == [1, 1]
    p.data_received(W.sub_count({a: 1, b: 2}), 0.2)
    assert p.publish(a, lazy) and calls == [1, 1, 1]
    p.data_received(W.sub_count({a: 0, b: 2}), 0.3)
    # a new session forgets the counts: unknown again -> publish
    p.connection_lost(1.0)
    assert p.subscriber_count(a) is None and p.wants_data(a)
    # queued while disconnected (count unknown)
    assert p.publish(a, lazy)


# -------------------------------------------------------------------------------- latched
def test_latched_republished_after_every_handshake():
    p = ClientProtocol()
    a = p.advertise("/a", "std_msgs/msg/String")
    tf = p.advertise("/tf_static", "tf2_msgs/msg/TFMessage", "latched")
    p.publish(tf, cdr(1))                    # before any session: kept, not queued twice
    p.publish(tf, cdr(2))
    p.publish(a, cdr(3))
    frames = connect(p)
    assert [f for f in frames if f[0] == "PUBLISH"] == [("PUBLISH", (a, cdr(3))),
                                                        ("PUBLISH", (tf, cdr(2)))]
    p.data_received(W.sub_count({tf: 0, a: 1}), 0.1)
    assert p.wants_data(tf)                  # latched data is never skipped
    p.publish(tf, cdr(4))
    assert W.parse(p.drain()) == [("PUBLISH", (tf, cdr(4)))]
    for k in range(2):
        p.connection_lost(1.0 + 10 * k)
        p.connection_started(3.0 + 10 * k)
        p.connection_made(3.0 + 10 * k)
        frames = W.parse(p.drain())
        assert [n for n, _ in frames] == ["HELLO", "ADVERTISE", "ADVERTISE", "PUBLISH"]
        assert frames[-1][1] == (tf, cdr(4))


# ---------------------------------------------------------------------------------- ERROR
def test_error_logged_as_warning_and_recorded(caplog):
    p = ClientProtocol()
    a = p.advertise("/a", "nope/msg/X")
    connect(p)
    with caplog.at_level(logging.WARNING, logger="ubrb_client"):
        evs = p.data_received(W.error(a, "unknown_type", "no such type") +
                              W.error(None, "hello_required"), 0.1)
    assert [(e.id, e.code) for e in evs] == [(1, "unknown_type"), (None, "hello_required")]
    assert list(p.errors) == evs
    assert "unknown_type" in caplog.text and "id=1" in caplog.text
    assert p.state == P.CONNECTED            # the connection is kept


def test_message_dispatch_and_unknown_sub():
    p = ClientProtocol()
    s = p.subscribe("/a", "std_msgs/msg/String")
    connect(p)
    evs = p.data_received(W.message(s, CDR) + W.message(99, CDR), 0.1)
    assert evs == [P.Message(s, CDR)]
    assert p.stats.messages_unknown_sub == 1


def test_malformed_header_from_bridge_closes_connection():
    p = ClientProtocol()
    connect(p)
    evs = p.data_received(b"HTTP/1.1 400 Bad", 0.2)
    assert isinstance(evs[0], P.ProtocolViolation)
    assert p.state == P.WAITING and p.connect_due(2.2)


def test_sync_ping_sequence():
    p = ClientProtocol()
    connect(p)
    assert p.send_ping() == 1
    assert W.ops(p.drain()) == ["PING"]
    p.data_received(F.encode_frame(F.PONG), 0.1)
    assert p.pongs_in_session == 1

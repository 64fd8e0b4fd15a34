"""Socket-level tests of Client against an in-test fake UBRB bridge (127.0.0.1, ephemeral port)."""
import threading
import time

import client_wire as W
import pytest
from client_fakebridge import FakeServer

from ubrb_client import Client


def cdr(i: int) -> bytes:
    return b"\x00\x01\x00\x00" + i.to_bytes(4, "little")


def publishes(frames, pid=None):
    return [f[1][1] for f in frames if f[0] == "PUBLISH" and (pid is None or f[1][0] == pid)]


@pytest.fixture
def server():
    s = FakeServer().start()
    yield s
    try:
        s.stop()
    except OSError:
        pass


def make_client(server, **kw):
    kw.setdefault("reconnect_interval", 0.1)
    return Client("127.0.0.1", server.port, name="test", **kw)


class StepClock:
    """The client's clock (Client(clock=...): its protocol is sans-IO): time moves only when
    the test advances it, so a reconnect happens when the test says, not after a sleep."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, c: Client, dt: float) -> None:
        self.t += dt
        c._wake()                            # its loop recomputes its deadlines now


def test_handshake_messages_subcount_errors(server):
    got, errs = [], []
    c = make_client(server, on_error=errs.append)
    pr = c.advertise("/r", "std_msgs/msg/String")
    sub = c.subscribe("/s", "std_msgs/msg/String", got.append)
    raw = []
    c.subscribe("/raw", "std_msgs/msg/String", raw.append, raw=True)
    with c:
        assert c.wait_connected(2, ack=True)
        assert c.server_info["server"] == "fake/0"
        assert server.wait(lambda: len(server.last.frames) >= 4)
        assert [n for n, _ in server.last.frames[:4]] == ["HELLO", "ADVERTISE", "SUBSCRIBE", "SUBSCRIBE"]
        msg = c.make("std_msgs/msg/String", {"data": "hello"})
        assert pr.publish_msg(msg)
        assert c.sync(2)                     # PING/PONG after the PUBLISH
        assert publishes(server.last.frames) == [c.store.serialize_cdr(msg, "std_msgs/msg/String").tobytes()]
        server.last.send(W.message(sub.id, bytes(c.store.serialize_cdr(msg, "std_msgs/msg/String")))
                         + W.message(2, b"\x00\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00"))
        server.last.send(W.sub_count({pr.id: 0}) + W.error(pr.id, "qos_conflict", "nope"))
        assert server.wait(lambda: got and raw and errs)
        assert got[0].data == "hello" and isinstance(raw[0], bytes)
        assert not pr.wants_data() and pr.subscriber_count == 0
        calls = []
        assert not pr.publish(lambda: calls.append(1) or cdr(0)) and not calls
        assert [(e.id, e.code) for e in c.errors] == [(pr.id, "qos_conflict")]
        assert errs[0].code == "qos_conflict"
        assert c.connected                  # ERROR keeps the connection
    assert c.state == "closed"


def test_server_killed_and_restarted_mid_stream(server):
    clock = StepClock()
    c = make_client(server, clock=clock, reconnect_interval=2.0)
    rel = c.advertise("/r", "std_msgs/msg/String")
    be = c.advertise("/b", "std_msgs/msg/String", "best_effort")
    c.subscribe("/s", "std_msgs/msg/String", lambda m: None)
    c.start()
    try:
        assert c.wait_connected(2)
        for i in range(3):
            rel.publish(cdr(i))
        be.publish(cdr(100))
        assert c.sync(2)
        first = server.last
        regs = [f for f in first.frames if f[0] in ("HELLO", "ADVERTISE", "SUBSCRIBE")]
        port = server.port
        server.stop()                        # kill the bridge
        assert server.wait(lambda: not c.connected, 2)
        for i in range(3, 6):
            assert rel.publish(cdr(i))       # queued while disconnected
        assert not be.publish(cdr(101))      # best-effort: dropped without a session
        assert c.stats["connect_attempts"] == 1  # the next waits for the reconnect interval
        clock.advance(c, 2.0)                # a refused reconnect attempt
        assert server.wait(lambda: c.stats["connect_failures"] >= 1, 5), c.stats
        assert c.stats["connect_attempts"] == 2
        server.port = port
        server.start()                       # bridge back on the same port
        clock.advance(c, 2.0)
        assert c.wait_connected(3)
        assert c.sync(2)
        second = server.last
        assert second is not first
        assert [f for f in second.frames if f[0] in ("HELLO", "ADVERTISE", "SUBSCRIBE")] == regs
        names = [n for n, _ in second.frames]
        assert names[:4] == ["HELLO", "ADVERTISE", "ADVERTISE", "SUBSCRIBE"]
        assert names[4:7] == ["PUBLISH"] * 3
        assert publishes(second.frames) == [cdr(3), cdr(4), cdr(5)]
        all_rel = publishes(server.all_frames(), rel.id)
        assert all_rel == [cdr(i) for i in range(6)]          # each delivered exactly once
        assert publishes(server.all_frames(), be.id) == [cdr(100)]  # best-effort not replayed
        assert c.stats["connects"] == 2
    finally:
        c.close()


def test_streaming_through_a_kill_no_duplicates_in_order(server):
    clock = StepClock()
    c = make_client(server, clock=clock, reconnect_interval=2.0)
    rel = c.advertise("/r", "std_msgs/msg/String")
    c.start()
    stop = threading.Event()
    published = []

    def pump():
        i = 0
        while not stop.is_set():
            if rel.publish(cdr(i)):
                published.append(i)
            i += 1
            time.sleep(0.0005)

    try:
        assert c.wait_connected(2)
        t = threading.Thread(target=pump)
        t.start()
        assert server.wait(lambda: len(publishes(server.last.frames)) > 50)
        first = server.last
        port = server.port
        server.stop()
        assert server.wait(lambda: not c.connected, 2)
        seen_down = len(published)
        assert server.wait(lambda: len(published) >= seen_down + 50, 5)  # queued while down
        server.port = port
        server.start()
        clock.advance(c, 2.0)                # the reconnect is due
        assert c.wait_connected(3)
        assert server.wait(lambda: server.last is not first
                           and len(publishes(server.last.frames)) > 50 + 50, 5)  # live again
        stop.set()
        t.join()
        assert c.sync(2)
        got = [int.from_bytes(b[4:], "little") for b in publishes(server.all_frames(), rel.id)]
        assert got == sorted(set(got))                        # in order, no duplicates
        # everything published once the client knew it was disconnected arrived
        assert set(published[seen_down:]) <= set(got)
        assert c.stats["dropped_reliable_queue_full"] == 0
    finally:
        stop.set()
        c.close()


def test_reconnect_after_silence(server):
    server.auto_ack = False
    server.auto_pong = False                 # a bridge that says nothing
    clock = StepClock()
    c = make_client(server, idle_timeout=10.0, ping_interval=2.0, clock=clock)
    c.start()
    try:
        assert c.wait_connected(2)
        assert server.wait(lambda: server.last is not None, 2)
        first = server.last
        for k in range(1, 5):                # a PING every 2 s, and nothing comes back
            clock.advance(c, 2.0)
            assert server.wait(lambda k=k: [n for n, _ in first.frames].count("PING") >= k, 5)
        assert c.connected and len(server.conns) == 1
        clock.advance(c, 2.0)                # 10 s without a byte: it gives up, and retries
        assert server.wait(lambda: c.stats["disconnects"] == 1, 5), c.stats
        assert c.proto.last_disconnect_reason == "idle timeout"
        clock.advance(c, 0.1)                # the reconnect interval
        assert server.wait(lambda: len(server.conns) == 2, 5)
    finally:
        c.close()


def test_close_stops_retrying(server):
    c = make_client(server)
    c.start()
    assert c.wait_connected(2)
    assert server.last is not None           # accepted
    c.close()
    n = len(server.conns)
    # close() ended the client's loop (the event: nothing is left that could reconnect)
    assert c._thread is not None and not c._thread.is_alive()
    assert len(server.conns) == n and c.state == "closed"


def test_tf_static_merged_and_republished(server):
    c = make_client(server)
    tf = c.advertise("/tf_static", "tf2_msgs/msg/TFMessage", "latched")
    def mk(child, x):
        return c.make("tf2_msgs/msg/TFMessage", {"transforms": [
            {"header": {"frame_id": "base_link"}, "child_frame_id": child,
             "transform": {"translation": {"x": x}}}]})
    tf.publish_msg(mk("laser", 1.0))
    tf.publish_msg(mk("imu_link", 2.0))
    tf.publish_msg(mk("laser", 3.0))          # replaces the first laser transform
    c.start()
    try:
        assert c.wait_connected(2) and c.sync(2)

        def merged(conn):
            data = publishes(conn.frames, tf.id)
            assert len(data) == 1
            m = c.store.deserialize_cdr(data[0], "tf2_msgs/msg/TFMessage")
            return sorted((t.child_frame_id, t.transform.translation.x) for t in m.transforms)

        assert merged(server.last) == [("imu_link", 2.0), ("laser", 3.0)]
        port = server.port
        server.stop()
        assert server.wait(lambda: not c.connected, 2)
        server.port = port
        server.start()
        assert c.wait_connected(3) and c.sync(2)
        assert merged(server.last) == [("imu_link", 2.0), ("laser", 3.0)]
    finally:
        c.close()


def test_loopback_echo(server):
    got = []
    c = make_client(server)
    pub = c.advertise("/loop", "std_msgs/msg/String")
    sub = c.subscribe("/loop", "std_msgs/msg/String", got.append, raw=True)
    server.echo = {pub.id: sub.id}
    with c:
        assert c.wait_connected(2)
        for i in range(100):
            pub.publish(cdr(i))
        assert server.wait(lambda: len(got) == 100, 3)
        assert got == [cdr(i) for i in range(100)]

"""Issue 21, item 1: a dead or slow reader never stalls the bridge, on both backends.

The companion (``companion_host.py``, its backend's interpreter) streams two reliable topics from
its own loop, 200 Hz each, as a gateway feeding it would; each topic has a real rclpy subscriber
(Kilted, Fast DDS) in a process of its own. The subscriber of the first topic is killed with
SIGKILL mid-stream (it stops acknowledging at once, and its DDS endpoints stay matched until
Fast DDS's lease expires) and a new one is started. Measured: the other topic's stream at its
subscriber (longest gap between arrivals, every message delivered once and in order), the
companion's loop (longest ``Companion.publish`` call, longest a due message waited) and how long
the new subscriber waits for its first message. Then the same through the whole chain: a UBRB
client streams both topics through the gateway and the UDP link to ``python -m ros_side``;
nothing may be dropped on the way and the link must stay up.

Before issue 21 the dds backend's writers of reliable volatile topics were KEEP_ALL with a 1 s
max_blocking_time: the dead reader's unacknowledged samples filled Cyclone's writer history
cache to its high-water mark, every write then blocked 1 s and timed out (DDS_RETCODE_TIMEOUT),
and the companion's whole loop stalled for every topic until Fast DDS's lease let go of the dead
reader (through the chain: the gateway stopped reading the client, the link went down and the
gateway dropped 648 PUBLISHes). Now they are KEEP_LAST(depth) as an rclpy publisher's: Cyclone
never blocks a KEEP_LAST writer (the oldest sample is replaced), so the dead reader costs at
most its own topic's history.
"""

import sys
import threading
import time

import pytest

from ros_helpers import wait_for
from tests.support.ros_procs import ROS_PYTHON, Host, Peer, require_ros, ros_env

T = "std_msgs/msg/String"
Q = {"reliability": "reliable", "durability": "volatile", "depth": 10}
# The other topic keeps 1 s of its stream (200 samples at 200 Hz): with KEEP_LAST 10 its writer
# overwrites what a live but CPU-starved reader has not acknowledged within 50 ms, as a native
# publisher of depth 10 would (11 of 1,277 lost once on a loaded 2-core machine): DDS's history,
# not the bridge. The victim's topic keeps depth 10: that is where the dead reader must not hold
# anything back.
Q_OTHER = dict(Q, depth=200)
PERIOD_MS = 5           # 200 Hz per topic
SIZE = 4096             # 800 KB/s per topic: past Cyclone's WHC high-water mark within 1 s
MAX_GAP_S = 0.2         # the other topic's stream at its subscriber
MAX_PUBLISH_MS = 50     # the longest Companion.publish call (measured 1.6-7.3 ms dds, 3-17 rclpy)
MAX_LAG_MS = 150        # the longest a due message waited for the loop (a 2-core machine's noise:
                        # up to 97 ms seen with rclpy; before issue 21 the dds backend: 1041 ms)

# `make test` runs this module after the rest, not beside other tests (tests/conftest.py,
# "serial"): a 200 ms bound on the other topic's longest gap and 150 ms on the loop's lag
# (0.29 s once beside the parallel pass's four workers).
pytestmark = pytest.mark.serial
AFTER_KILL_S = 3.0      # streaming after the kill (Fast DDS's lease is 20 s: still matched; the
                        # dead reader filled the WHC within 1 s: SIZE)


def seqs(peer, k):
    """(n, arrival time at the subscriber) of each message on a stream, in arrival order."""
    return [(int(bytes.fromhex(e["data"])[8:].split(b":")[1]), e["at"])
            for e in peer.of("msg", id=k)]


def kill_and_replace(victim, topic, env):
    """SIGKILL the victim (no goodbye on the wire: it stays matched until its lease ends), start
    a new subscriber of `topic` at once, and let the streams run AFTER_KILL_S from the kill:
    (the new peer, its first message or None, how long that took in s or None, the kill's time)."""
    t_kill = time.monotonic()
    victim.proc.kill()
    victim.proc.wait(10)
    late = Peer("rclpy", env)
    t_late = time.monotonic()
    k_late = late.endpoint("sub", topic, T, Q)
    first = wait_for(lambda: late.of("msg", id=k_late), 15)
    late_wait = (first[0]["at"] - t_late) if first else None
    time.sleep(max(0.0, AFTER_KILL_S - (time.monotonic() - t_kill)))
    return late, first, late_wait, t_kill


@pytest.mark.parametrize("backend", ["dds", "rclpy"])
def test_a_killed_subscriber_stalls_nothing(backend):
    require_ros()
    env = ros_env(ROS_DISTRO="kilted")
    host = Host(backend, env)
    other = Peer("rclpy", env)
    victim = Peer("rclpy", env)
    late = None
    try:
        a, b = "/i21_dead_a_%s" % backend, "/i21_dead_b_%s" % backend
        assert host.advertise(1, a, T, Q)["code"] is None
        assert host.advertise(2, b, T, Q_OTHER)["code"] is None
        k_a = victim.endpoint("sub", a, T, Q)
        k_b = other.endpoint("sub", b, T, Q_OTHER)
        assert wait_for(lambda: host.counts(1)[-1:] == [1] and host.counts(2)[-1:] == [1], 15), \
            (host.counts(1), host.counts(2))
        for k, p in ((k_a, victim), (k_b, other)):
            assert wait_for(lambda k=k, p=p: p.call("count", id=k)["count"] == 1, 10)
        host.call("stream", slot=1, period_ms=PERIOD_MS, size=SIZE)
        host.call("stream", slot=2, period_ms=PERIOD_MS, size=SIZE)
        assert wait_for(lambda: len(victim.received(k_a)) > 50 and len(other.received(k_b)) > 50,
                        10), "the streams did not start"
        before = host.call("lag", reset=True)
        late, first, late_wait, t_kill = kill_and_replace(victim, a, env)
        host.call("stream", slot=1, period_ms=0)
        host.call("stream", slot=2, period_ms=0)
        after = host.call("lag")
        sent_b = before["sent"]["2"] + after["sent"]["2"]
        wait_for(lambda: len(other.received(k_b)) >= sent_b, 5)
        got_b = seqs(other, k_b)
        window = [at for _, at in got_b if at >= t_kill - 0.5]
        gaps = [y - x for x, y in zip(window, window[1:])]
        max_gap = max(gaps) if gaps else float("inf")
        print("killed subscriber (%s backend): other topic %d/%d delivered, longest gap %.0f ms; "
              "companion loop: longest publish %.1f ms, poll %.1f ms, lag %.1f ms, %d publish errors; "
              "new subscriber's first message after %s"
              % (backend, len(got_b), sent_b, max_gap * 1000, after["publish_ms"],
                 after["poll_ms"], after["lag_ms"], after["pub_errors"],
                 "%.2f s" % late_wait if late_wait is not None else "never (15 s)"))
        assert first, "the new subscriber of %s received nothing in 15 s" % a
        assert [n for n, _ in got_b] == list(range(sent_b)), "the other topic lost or reordered"
        assert max_gap <= MAX_GAP_S, "the other topic's stream stopped for %.2f s" % max_gap
        assert after["publish_ms"] <= MAX_PUBLISH_MS and after["lag_ms"] <= MAX_LAG_MS, after
        assert after["pub_errors"] == 0, after
    finally:
        for p in (late, victim, other, host):
            if p is not None:
                p.close()


@pytest.mark.parametrize("backend", ["dds", "rclpy"])
def test_a_killed_subscriber_through_the_gateway_stalls_nothing(backend):
    """The same through the whole chain: a UBRB client streams both topics (200 Hz each)
    through the gateway and the UDP link to ``python -m ros_side``. Nothing is dropped on the
    way (gateway and link counters), the link stays up, the other topic's stream has no gap."""
    require_ros()
    from tests.e2e.helpers import E2E_DOMAIN, Client, LinkBridge
    env = ros_env(domain=E2E_DOMAIN, ROS_DISTRO="kilted")
    other = Peer("rclpy", env)
    victim = Peer("rclpy", env)
    bridge = LinkBridge("udp", companion_python=ROS_PYTHON if backend == "rclpy"
                        else sys.executable, backend=backend, companion_env=env)
    client = late = None
    stop = threading.Event()
    sent = {1: 0, 2: 0}
    failure = []

    def stream():
        nxt = time.monotonic()
        try:
            while not stop.is_set():
                for s in (1, 2):
                    head = "%d:%d:" % (s, sent[s])
                    raw = (head + "x" * (SIZE - len(head))).encode()
                    client.publish(s, b"\x00\x01\x00\x00" + (len(raw) + 1).to_bytes(4, "little")
                                   + raw + b"\x00")
                    sent[s] += 1
                nxt += PERIOD_MS / 1000.0
                time.sleep(max(0.0, nxt - time.monotonic()))
        except Exception as e:  # e.g. the gateway stopped reading us (sendall timed out)
            failure.append(repr(e))
    th = threading.Thread(target=stream, daemon=True)
    try:
        a, b = "/i21_chain_a_%s" % backend, "/i21_chain_b_%s" % backend
        k_a = victim.endpoint("sub", a, T, Q)
        k_b = other.endpoint("sub", b, T, Q_OTHER)
        client = Client(bridge.port, "streamer")
        client.advertise(1, a, T, Q)
        client.advertise(2, b, T, Q_OTHER)
        assert client.wait(lambda: client.count_of(1) == 1 and client.count_of(2) == 1, 15), \
            client.counts
        for k, p in ((k_a, victim), (k_b, other)):
            assert wait_for(lambda k=k, p=p: p.call("count", id=k)["count"] == 1, 10)
        th.start()
        assert wait_for(lambda: len(victim.received(k_a)) > 50 and len(other.received(k_b)) > 50,
                        10), "the streams did not start"
        gw0, link0 = dict(bridge.gw.counters()), dict(bridge.driver.counters())
        late, first, late_wait, t_kill = kill_and_replace(victim, a, env)
        stop.set()
        th.join(5)
        wait_for(lambda: len(other.received(k_b)) >= sent[2], 5)
        gw1, link1 = bridge.gw.counters(), bridge.driver.counters()
        got_b = seqs(other, k_b)
        window = [at for _, at in got_b if at >= t_kill - 0.5]
        gaps = [y - x for x, y in zip(window, window[1:])]
        max_gap = max(gaps) if gaps else float("inf")
        lost = {k: gw1[k] - gw0[k] for k in ("dropped_no_ros", "dropped_queue")}
        lost.update({"link_" + k: link1[k] - link0[k]
                     for k in ("drop_rel_full", "drop_down", "down")})
        print("killed subscriber through the gateway (%s backend): other topic %d/%d "
              "delivered, longest gap %.0f ms; dropped on the way %s; new subscriber's first "
              "message after %s" % (backend, len(got_b), sent[2], max_gap * 1000, lost,
                                    "%.2f s" % late_wait if late_wait is not None
                                    else "never (15 s)"))
        assert not failure, failure
        assert first, "the new subscriber of %s received nothing in 15 s" % a
        assert [n for n, _ in got_b] == list(range(sent[2])), "the other topic lost or reordered"
        assert max_gap <= MAX_GAP_S, "the other topic's stream stopped for %.2f s" % max_gap
        assert not any(lost.values()), lost
        assert client.error_codes() == [], client.errors
    finally:
        stop.set()
        if client is not None:
            client.close()
        bridge.close()
        for p in (late, victim, other):
            if p is not None:
                p.close()

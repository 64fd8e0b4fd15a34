"""Issue 5 on the real chain: the client library and its CLI through gateway, link and companion.

    ubrb_client.Client ──TCP── ubrb_min.py ══UDP link══ python -m ros_side (dds) ══DDS══ this process

Real processes on 127.0.0.1: the gateway on a TCP port picked here (it must come back on the same
port after a SIGKILL), the companion on a free UDP port, and an independent DDS participant in
this test process (``DdsBackend`` used as a plain participant: raw readers and writers). DDS never
leaves loopback (``LOOPBACK_XML`` in this process and in every child) and runs in a domain id of
our own (tests/support/domains.py).

What a gateway restart may lose, and what these tests therefore tolerate
    TCP cannot tell the client what the peer has read. A PUBLISH the client handed to the kernel
    before it noticed the gateway was gone may have died with the gateway (unread, or read but not
    yet forwarded over the link). Such messages were all published while the *first* session was
    up, and since the gateway, the link and DDS keep order, what is lost is one contiguous run of
    them: a single gap at the kill (session-1 messages still in the client's queue when it noticed
    follow in session 2). Everything published once the client had noticed the disconnect
    (queued) or after it reconnected must arrive exactly once and in order, and nothing may ever
    arrive twice or out of order.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
import threading
import time
from typing import Any, Dict, Iterator, List, Optional

import pytest

from ubrb_client import Client

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GATEWAY = os.path.join(ROOT, "ubrb_min.py")

cyclonedds = pytest.importorskip("cyclonedds")

from ros_side.backends.dds import LOOPBACK_XML, DdsBackend  # noqa: E402
from tests.support.dds import confine_this_process  # noqa: E402
from tests.support.domains import test_domain  # noqa: E402
from tests.support.loopback_ports import free_port  # noqa: E402
from tests.support.procs import Proc, child_env, wait_for  # noqa: E402

# Before any cyclonedds domain exists in this process (the backend below also gets it explicitly).
confine_this_process()

# this process's own domain for the chain tests (tests/support/domains.py)
DOMAIN = test_domain("chain", "UBRB_CHAIN_DOMAIN")
NS = "/ubrb_chain_%d" % os.getpid()       # topic prefix: nothing shared with another run
STRING = "std_msgs/msg/String"
REL_QOS = {"reliability": "reliable", "durability": "volatile", "depth": 1000}
BE_QOS = {"reliability": "best_effort", "durability": "volatile", "depth": 1000}

pytestmark = [
    pytest.mark.skipif(not os.path.exists(GATEWAY), reason="ubrb_min.py not present"),
    pytest.mark.time_limit(60),
]


# -- helpers ---------------------------------------------------------------------------------------
def string_cdr(text: str) -> bytes:
    """std_msgs/msg/String as CDR (little-endian, encapsulation header included)."""
    b = text.encode() + b"\0"
    return b"\x00\x01\x00\x00" + len(b).to_bytes(4, "little") + b


def string_of(cdr: bytes) -> str:
    """The data of a std_msgs/msg/String sample from DDS (it may carry 0-3 padding bytes)."""
    n = int.from_bytes(cdr[4:8], "little")
    return cdr[8:8 + n - 1].decode()


class Chain:
    """Companion (dds backend, our domain) and gateway, linked over UDP on loopback."""

    def __init__(self) -> None:
        self.procs: List[Proc] = []
        self.port = free_port(socket.SOCK_STREAM)      # fixed: the restart needs the same port
        self.link = "udp://127.0.0.1:%d" % free_port(socket.SOCK_DGRAM)
        try:
            self.companion = self._spawn([sys.executable, "-m", "ros_side", "--link", self.link,
                                          "--backend", "dds", "--domain", str(DOMAIN),
                                          "--no-diagnostics"])
            self.companion.wait_line(r"companion on link", 15)
            self.gateway = self.start_gateway()
        except BaseException:
            self.close()
            raise

    def _spawn(self, argv: List[str]) -> Proc:
        p = Proc(argv, env=child_env(DOMAIN))
        self.procs.append(p)
        return p

    def start_gateway(self) -> Proc:
        gw = self._spawn([sys.executable, GATEWAY, "--listen", "127.0.0.1:%d" % self.port,
                          "--link", self.link])
        gw.wait_line(r"listening on 127\.0\.0\.1:%d" % self.port, 10)
        return gw

    def wait_ros_up(self, gw: Proc) -> None:
        gw.wait_line(r"ROS side up", 10)

    def kill_gateway(self) -> None:
        self.gateway.kill()

    def close(self) -> None:
        for p in self.procs:
            p.kill()


@pytest.fixture
def chain() -> Iterator[Chain]:
    c = Chain()
    try:
        c.wait_ros_up(c.gateway)
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def dds() -> Iterator[DdsBackend]:
    b = DdsBackend(domain=DOMAIN, distro="humble", config=LOOPBACK_XML)
    yield b
    b.close()


class Reader:
    """A DDS reader of std_msgs/String in this process: (data, arrival time) of every sample."""

    def __init__(self, dds: DdsBackend, topic: str, qos: Dict[str, Any]) -> None:
        self.lock = threading.Lock()
        self.items: List[tuple] = []
        self.dds = dds
        self.handle = dds.create_subscription(topic, STRING, qos, self._on)

    def _on(self, data: bytes) -> None:
        with self.lock:
            self.items.append((string_of(data), time.monotonic()))

    def seqs(self, prefix: str) -> List[int]:
        """Sequence numbers of the samples whose data is ``prefix + number``, in arrival order."""
        with self.lock:
            return [int(s[len(prefix):]) for s, _ in self.items if s.startswith(prefix)]

    def arrivals(self, prefix: str) -> Dict[int, float]:
        with self.lock:
            return {int(s[len(prefix):]): t for s, t in self.items if s.startswith(prefix)}

    def close(self) -> None:
        self.dds.destroy_subscription(self.handle)


def runs(seqs: List[int]) -> List[List[int]]:
    """[3, 4, 5, 9] -> [[3, 4, 5], [9]]."""
    out: List[List[int]] = []
    for s in sorted(seqs):
        if out and out[-1][-1] == s - 1:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def no_errors(c: Client) -> List[Any]:
    return [(e.code, e.id, e.message) for e in c.errors]


def gateway_counters(gw: Proc) -> str:
    """Stop a gateway with SIGTERM; the counters it logs on the way out."""
    if gw.proc.poll() is None:
        gw.proc.send_signal(signal.SIGTERM)
    try:
        gw.wait(5)
    except AssertionError:
        gw.kill()
    text = gw.text()
    i = text.rfind("counters (non-zero):")
    return text[i:] if i >= 0 else "(no counters logged)"


# -- 1: kill and restart the gateway mid-stream ----------------------------------------------------
def test_gateway_killed_and_restarted_mid_stream(chain: Chain, dds: DdsBackend) -> None:
    """Reliable data published at ~400 Hz on one topic and best-effort data on another while the
    gateway is SIGKILLed and restarted on the same port. The client reconnects by itself (every
    20 ms, so it is back as soon as the new gateway listens), re-registers with the same ids and
    sends what it queued meanwhile.

    Reliable, at the DDS reader: no duplicates, no reordering; everything whose publish began
    after session 1 was over (queued) or in session 2 arrives exactly once; the only loss allowed
    is one contiguous run of messages whose publish began while session 1 was up (handed to the
    kernel before the client noticed the kill; see the module docstring). Best effort: nothing
    published while disconnected is kept, nothing of session 1 is sent again in session 2.

    The gateway is restarted at once, so its link comes up only once the companion's session
    with the killed gateway has timed out (unkeyed link: ~2 s, docs/LINK.md); the new gateway
    serves the client at once but must hold its replayed reliable PUBLISHes until then (its
    start-up window, 3 s: Gateway.hold_for_ros), or it drops them (``dropped_no_ros``, in the
    assertion message's counters).
    """
    rel_topic, be_topic, back_topic = NS + "/rel", NS + "/be", NS + "/back"
    rel_reader = Reader(dds, rel_topic, REL_QOS)
    be_reader = Reader(dds, be_topic, BE_QOS)
    back_writer = dds.create_publisher(back_topic, STRING, REL_QOS)
    back: List[str] = []
    c = Client("127.0.0.1", chain.port, name="chain_restart", reconnect_interval=0.02)
    rel = c.advertise(rel_topic, STRING, REL_QOS)
    be = c.advertise(be_topic, STRING, "best_effort")
    sub = c.subscribe(back_topic, STRING, lambda m: back.append(m.data), REL_QOS)

    def round_trip(tag: str) -> bool:
        """A DDS message on back_topic reaches our subscription (by its id) through the chain."""
        def got() -> bool:
            if any(s.startswith(tag) for s in back):
                return True
            dds.publish(back_writer, string_cdr("%s %d" % (tag, len(back))))
            return False
        return bool(wait_for(got, 10, 0.05))

    # one record per publish: (seq, connects before, connected before, connects after,
    #                          connected after, reliable accepted, best effort accepted)
    rec: List[tuple] = []
    stop = threading.Event()

    def publisher() -> None:
        i = 0
        while not stop.is_set():
            b = c.stats
            ok_r = rel.publish(string_cdr("r %d" % i))
            ok_b = be.publish(string_cdr("b %d" % i))
            a = c.stats
            rec.append((i, b["connects"], b["state"] == "connected", a["connects"],
                        a["state"] == "connected", ok_r, ok_b))
            i += 1
            time.sleep(0.002)

    t = threading.Thread(target=publisher, daemon=True)
    counters = ""
    try:
        c.start()
        assert c.wait_connected(5, ack=True)
        # The companion's writers have matched our readers (SUB_COUNT counts foreign readers).
        assert wait_for(lambda: rel.subscriber_count and be.subscriber_count, 10), c.stats
        assert round_trip("before")
        t.start()
        assert wait_for(lambda: len(rel_reader.seqs("r ")) >= 50, 10), "no data through the chain"

        chain.kill_gateway()                                    # SIGKILL, mid-stream
        assert wait_for(lambda: not c.connected, 5), "the client did not notice the kill"
        n_detected = len(rec)
        assert wait_for(lambda: len(rec) >= n_detected + 25, 5)  # queued while disconnected
        t_restart = time.monotonic()
        chain.gateway = chain.start_gateway()                   # same port
        assert wait_for(lambda: c.stats["connects"] == 2 and c.connected, 10), c.stats
        n_reconnected = len(rec)
        chain.gateway.wait_line(r"says HELLO: 'chain_restart'", 5)
        log = chain.gateway.text()
        assert "ROS side up" not in log[:log.index("says HELLO: 'chain_restart'")], (
            "precondition: the client is served before the restarted gateway's link is up (its "
            "replayed PUBLISHes must wait for the link)\n" + log)
        chain.gateway.wait_line(r"ROS side up", 10)
        assert wait_for(lambda: len(rec) >= n_reconnected + 50, 5)
        stop.set()
        t.join(5)
        assert c.sync(5)
        last = rec[-1][0]
        wait_for(lambda: last in rel_reader.seqs("r "), 10)
        assert round_trip("after")                              # the subscription id came back
        st = c.stats
    finally:
        stop.set()
        if t.is_alive():
            t.join(5)
        c.close()
        rel_reader.close()
        be_reader.close()
        dds.destroy_publisher(back_writer)
        counters = gateway_counters(chain.gateway)

    # The client's side of it: same ids, nothing refused by the new gateway, nothing left queued.
    assert (rel.id, be.id, sub.id) == (1, 2, 1)
    assert no_errors(c) == []          # same ids on a fresh gateway: no unknown_id, duplicate_id
    assert st["connects"] == 2 and st["messages_unknown_sub"] == 0 and st["queued_bytes"] == 0
    assert all(r[5] for r in rec), "a reliable publish was refused"

    # Best effort: refused while disconnected, never kept, never sent again after the restart.
    b_arrived = be_reader.arrivals("b ")
    bgot = be_reader.seqs("b ")
    refused = [r[0] for r in rec if not r[6]]
    assert refused, "no best-effort publish was refused while disconnected"
    assert all(not (r[2] and r[4]) for r in rec if not r[6]), "best effort refused while connected"
    assert st["dropped_best_effort_no_session"] >= len(refused)
    assert not set(refused) & set(bgot), "best-effort messages of the outage were sent later"
    assert len(bgot) == len(set(bgot)) and bgot == sorted(bgot), "best effort duplicated/reordered"
    replayed = [r[0] for r in rec if r[3] == 1 and r[0] in b_arrived
                and b_arrived[r[0]] > t_restart]
    assert not replayed, "best-effort messages of session 1 sent again after the restart: %s" % replayed
    assert any(s >= n_reconnected for s in bgot), "no best-effort data after the reconnect"

    # Reliable.
    got = rel_reader.seqs("r ")
    live1 = {r[0] for r in rec if r[1] == 1 and r[2]}           # publish began in session 1
    assert len(got) == len(set(got)), "duplicates: %s" % sorted({s for s in got if got.count(s) > 1})
    assert got == sorted(got), "reordered: %s" % got
    missing = sorted(set(r[0] for r in rec) - set(got))
    must = [s for s in missing if s not in live1]
    assert not must, (
        "%d of the %d reliable messages queued after the disconnect or published in session 2 "
        "never reached DDS: %s. Gateway after the restart, counters: %s"
        % (len(must), len(rec) - len(live1), [(g[0], g[-1]) for g in runs(must)], counters))
    gaps = runs(missing)
    assert len(gaps) <= 1, "more than one gap around the kill: %s" % gaps
    assert len(missing) <= 100, "lost %d messages around the kill" % len(missing)


# -- 2: the reliable queue bound while the gateway is down ------------------------------------------
def test_queue_bound_while_gateway_down(chain: Chain, dds: DdsBackend) -> None:
    """max_queued_bytes while the gateway is down: whole frames are queued up to the bound, the
    *new* message is refused beyond it (publish() False, dropped_reliable_queue_full), and what was
    queued reaches DDS exactly once, in order, after the gateway is back.

    The client retries only every second here; whether it is back before the restarted gateway's
    link is up or after, its replay arrives (before, the gateway holds it: its start-up window,
    which test_gateway_killed_and_restarted_mid_stream covers).
    """
    topic = NS + "/bound"
    reader = Reader(dds, topic, REL_QOS)
    frame = 12 + 4 + len(string_cdr("q 000"))       # header + publisher id + CDR: all the same size
    cap = 10
    c = Client("127.0.0.1", chain.port, name="chain_bound", reconnect_interval=1.0,
               max_queued_bytes=cap * frame + frame // 2)
    pub = c.advertise(topic, STRING, REL_QOS)
    try:
        c.start()
        assert c.wait_connected(5, ack=True)
        assert wait_for(lambda: pub.subscriber_count, 10), c.stats
        assert pub.publish(string_cdr("q 000"))
        assert wait_for(lambda: reader.seqs("q ") == [0], 10), reader.items

        chain.kill_gateway()
        assert wait_for(lambda: not c.connected, 5)
        results = [pub.publish(string_cdr("q %03d" % i)) for i in range(1, 26)]
        # The first `cap` are queued; the bound refuses the *new* ones (a gap-free prefix stays).
        assert results == [True] * cap + [False] * (25 - cap)
        st = c.stats
        assert st["dropped_reliable_queue_full"] == 25 - cap
        assert st["queued_bytes"] == cap * frame
        assert st["published"] == 1 + cap

        gw = chain.gateway = chain.start_gateway()
        chain.wait_ros_up(gw)
        assert wait_for(lambda: c.stats["connects"] == 2 and c.connected, 10), c.stats
        gw.wait_line(r"says HELLO: 'chain_bound'", 5)
        assert wait_for(lambda: c.stats["queued_bytes"] == 0, 5)
        assert pub.publish(string_cdr("q 100"))           # after the replay, on the new session
        assert c.sync(5)
        wait_for(lambda: 100 in reader.seqs("q "), 10)
        got = reader.seqs("q ")
        assert got == [0] + list(range(1, cap + 1)) + [100], (
            "got %s; gateway after restart:\n%s" % (got, gw.text()[-3000:]))
        assert no_errors(c) == []
        assert c.stats["dropped_reliable_queue_full"] == 25 - cap
    finally:
        c.close()
        reader.close()


# -- 3: the CLI's pub / echo round trip --------------------------------------------------------------
def test_cli_pub_echo_round_trip(chain: Chain, dds: DdsBackend) -> None:
    server = ["--server", "127.0.0.1:%d" % chain.port]
    cli = [sys.executable, "-m", "ubrb_client"]
    # A foreign DDS writer on /chatter, never written: it tells us when the companion's reader
    # (made for echo's SUBSCRIBE) exists, so pub's first message has somewhere to go.
    probe = dds.create_publisher("/chatter", STRING, BE_QOS)
    echo = Proc(cli + ["echo", "/chatter", STRING, "--count", "3", "--duration", "20"] + server,
                env=child_env(DOMAIN))
    pub: Optional[Proc] = None
    try:
        assert wait_for(lambda: dds.subscription_count(probe) >= 1, 15), echo.text()
        pub = Proc(cli + ["pub", "/chatter", STRING, "{data: hello}", "--rate", "5", "--count", "5"]
                   + server, env=child_env(DOMAIN))
        assert pub.wait(15) == 0, pub.text()
        assert echo.wait(15) == 0, echo.text()
        docs = echo.stdout().split("---\n")
        assert docs == ["data: hello\n"] * 3 + [""], echo.text()
        assert len(re.findall(r"^publishing #\d+", pub.stdout(), re.M)) == 5, pub.text()
    finally:
        for p in (echo, pub):
            if p is not None:
                p.kill()
        dds.destroy_publisher(probe)

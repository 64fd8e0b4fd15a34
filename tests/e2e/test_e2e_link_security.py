"""The link against third parties (issue 14), through the real processes: a forged HELLO leaves
data flowing; without the key nobody can inject into ROS or reach a UE client; keyed serial and
UDP links carry data end to end; unkeyed UDP stays on loopback unless --insecure-link.

The attacker is a LinkSession of the core on its own loopback UDP socket: it speaks the protocol
exactly, so what stops it is the key (or, for a lone HELLO, the handshake rules), not a malformed
frame."""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
import time
from typing import Any, Iterator, List, Optional

import pytest

import ubrb_min as U
from tests.e2e.helpers import (
    both_matched,
    Dds,
    RawCollector,
    e2e_proc,
    companion_argv,
    key_file,
    make_bridge,
    matched,
    open_bridge,
    ser,
    string_msg,
)
from tests.support import ros_idl as I
from tests.support.loopback_ports import free_port
from tests.support.procs import ROOT, wait_for
from tests.support.qos import QOS_R

S = "std_msgs/msg/String"
GATEWAY = os.path.join(ROOT, "ubrb_min.py")


class Attacker:
    """A link end of the core on a loopback UDP socket, pumped in a thread: `to` is where it
    sends (None: answer whoever wrote last), `bind` the port it owns."""

    def __init__(self, gateway: bool, to: Optional[tuple] = None, bind: int = 0,
                 key: Optional[bytes] = None, known: int = 0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", bind))
        self.sock.settimeout(0.005)
        self.to = to
        self.s = U.LinkSession(self, int.from_bytes(os.urandom(3), "little") + 7, gateway,
                               datagram=True, max_frame=1400, key=key)
        self.s.peer_epoch = known   # the epoch it claims to know (sniffed)
        self.ups = 0
        self.on_up: Any = None      # called at link up
        self.every: Any = None      # called every 100 ms while up
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)

    # link handler
    def link_up(self, fresh: bool) -> None:
        self.ups += 1
        if self.on_up:
            self.on_up(self.s)

    def link_down(self) -> None:
        pass

    def link_message(self, t: int, slot: int, buf: Any, off: int, n: int, reliable: bool) -> None:
        # Play the companion as a peer that knows the record layer: accept every subscription
        # (echoing its generation), so forged MSG records on that slot are delivered.
        if t == U.LK_T_SUB:
            gen = json.loads(bytes(buf[off:off + n])).get("gen", 0)
            r = json.dumps({"kind": "sub", "code": None, "message": "", "gen": gen}).encode()
            self.s.send(U.LK_T_RESULT, slot, r, 0, len(r), True, True)

    def _run(self) -> None:
        buf = bytearray(2048)
        while not self.stop.is_set():
            now = int(time.monotonic() * 1000)
            try:
                n, addr = self.sock.recvfrom_into(buf)
                if self.to is None:
                    self.to = addr
                self.s.feed(buf, 0, n, now)
            except socket.timeout:
                pass
            self.s.tick(now)
            if self.every and self.s.is_up() and now - getattr(self, "_last", 0) >= 100:
                self._last = now
                self.every(self.s)
            for _ in range(16):
                k = self.s.poll_tx(now)
                if not k:
                    break
                if self.to is not None:
                    self.sock.sendto(self.s.tx_buf[:k], self.to)

    def start(self) -> "Attacker":
        self.t.start()
        return self

    def close(self) -> None:
        self.stop.set()
        self.t.join(5)
        self.sock.close()


def forged_hello(gateway: bool, known: int = 0, key: Optional[bytes] = None) -> bytes:
    f = U.LinkSession(None, int.from_bytes(os.urandom(3), "little") + 7, gateway, datagram=True,
                      key=key)
    f.peer_epoch = known
    n = f.poll_tx(0)
    return bytes(f.tx_buf[:n])


def seq_of(data: bytes) -> int:
    return int(I.String.deserialize(data).data.split()[1])


class Publisher:
    """A UBRB client publishing "seq N" every 20 ms, with the time each was sent."""

    def __init__(self, client: Any, pub_id: int) -> None:
        self.client, self.pub_id = client, pub_id
        self.sent: List[float] = []
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.sent.append(time.monotonic())
            self.client.publish(self.pub_id, ser(string_msg("seq %d" % (len(self.sent) - 1)), S))
            self.stop.wait(0.02)

    def close(self) -> None:
        self.stop.set()
        self.t.join(5)


@pytest.fixture(scope="module", params=["unkeyed", "keyed"])
def udp(request: Any, tmp_path_factory: Any) -> Iterator[Any]:
    kf = key_file(tmp_path_factory.mktemp("key")) if request.param == "keyed" else None
    for b in open_bridge("udp", key_file=kf):
        b.kind = request.param  # type: ignore[attr-defined]
        yield b


def test_forged_hello_leaves_data_flowing(udp: Any, connect: Any, dds: Dds) -> None:
    """The issue's attack: one HELLO with an unknown epoch to the companion (which used to stop
    all data for good); it gets no answer (unkeyed, a stranger learns no epoch from a live
    companion; keyed, a HELLO without a valid MAC is dropped unread).
    Keyed, also one that knows the companion's epoch (sniffed) but not the key. Neither touches
    the session: data keeps reaching ROS, no gap of 2 s. (Unkeyed, a HELLO that knows the epoch
    is a takeover: without a key there is no authentication, hence loopback only.)"""
    topic = "/e2e_forge_%s" % udp.kind
    raw = RawCollector(dds.reader("rt" + topic, I.String, depth=1000))
    a = connect(udp, "pub")
    a.advertise(1, topic, S)
    assert wait_for(lambda: both_matched(a, 1, raw.reader), 10)
    pub = Publisher(a, 1)
    comp = ("127.0.0.1", int(udp.comp_url.rsplit(":", 1)[1]))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.5)
    downs = udp.link_counters()["down"]
    try:
        assert len(raw.wait(10)) >= 10
        t0 = time.monotonic()
        sock.sendto(forged_hello(True), comp)
        try:
            sock.recv(2048)
            answered = True
        except socket.timeout:
            answered = False
        # unkeyed, a live companion tells no stranger its epoch; keyed, a HELLO without a valid
        # MAC is dropped before anything looks at it
        assert not answered
        if udp.kind == "keyed":             # knowing the epoch (sniffed), without the key
            sock.sendto(forged_hello(True, udp.driver.s.peer_epoch, os.urandom(32)), comp)
        n0 = len(pub.sent)                  # published after the forged HELLOs
        # flowing within 2 s: something published after the attack has reached ROS
        assert wait_for(lambda: any(seq_of(d) >= n0 for d in raw.poll()),
                        2.0 - (time.monotonic() - t0)), "no data within 2 s of the forged HELLO"
        time.sleep(1.5)
    finally:
        pub.close()
        sock.close()
    n1 = len(pub.sent)
    assert wait_for(lambda: {seq_of(d) for d in raw.poll()} >= set(range(n0, n1)), 10), \
        "messages published after the attack were lost"
    assert udp.link_counters()["down"] == downs     # the session was never interrupted
    print("%s: all %d messages published after the forged HELLOs reached ROS" % (udp.kind, n1 - n0))


def test_third_party_without_key_cannot_inject_into_ros(udp: Any, dds: Dds) -> None:
    """A full protocol end that sniffed the companion's epoch, without the key (no key, or another
    one), talks to the companion for 3 s and publishes; an independent DDS reader sees nothing,
    and the gateway keeps (or wins back) its link. The in-run comparison: the same attacker
    against an unkeyed companion with no gateway yet gets in, and the reader sees it."""
    topic = "/e2e_inject_%s" % udp.kind
    raw = RawCollector(dds.reader("rt" + topic, I.String, depth=100))
    body = U.link_record_body({"topic": topic, "type": S, "gen": 1,
                               "qos": {"reliability": "reliable", "durability": "volatile",
                                       "depth": 10}})
    data = ser(string_msg("INJECTED-BY-THIRD-PARTY"), S)

    def inject(s: Any) -> None:
        s.send(U.LK_T_ADV, 7, body, 0, len(body), True, True)
        for _ in range(20):
            s.send(U.LK_T_PUB, 7, data, 0, len(data), True)

    def attack(port: int, key: Optional[bytes], known: int) -> Attacker:
        atk = Attacker(True, to=("127.0.0.1", port), key=key, known=known)
        atk.on_up = inject
        atk.start()
        try:
            time.sleep(3.0)
        finally:
            atk.close()
        return atk

    if udp.kind == "unkeyed":
        port = free_port(socket.SOCK_DGRAM)
        p = e2e_proc(companion_argv("udp://127.0.0.1:%d" % port))
        try:
            p.wait_line(r"companion on link")
            atk = attack(port, None, 0)
            assert atk.ups >= 1 and wait_for(lambda: raw.poll() != [], 10), \
                "the attacker does not work: it should get into an unkeyed companion"
        finally:
            p.stop()
        print("unkeyed companion: %d injected messages reached ROS" % len(raw.got))
        return
    comp = int(udp.comp_url.rsplit(":", 1)[1])
    for key in (None, os.urandom(32)):
        atk = attack(comp, key, udp.driver.s.peer_epoch)
        assert atk.ups == 0 and raw.poll() == [], key
    assert udp.gw.ros_ready and udp.link_counters()["down"] == 0


def gateway_proc(link: str, *extra: str) -> Any:
    p = e2e_proc([sys.executable, GATEWAY, "--listen", "127.0.0.1:0", "--link", link, *extra])
    m = p.wait_line(r"listening on [\d.]+:(\d+)")
    return p, int(m.group(1))


@pytest.mark.parametrize("kind", ["unkeyed", "keyed"])
def test_squatter_on_the_companion_port_cannot_reach_ue_clients(kind: str, tmp_path: Any,
                                                                connect: Any) -> None:
    """A process owns the companion's port before the companion starts and answers as one. With a
    key on the gateway it never gets a session, and a subscribed UE client receives nothing; with
    none it forges MESSAGEs to the client (the in-run comparison)."""
    from tests.e2e.helpers import Client

    port = free_port(socket.SOCK_DGRAM)
    atk = Attacker(False, bind=port)
    data = ser(string_msg("FORGED-MESSAGE"), S)

    def forge(s: Any) -> None:
        for slot in range(4):
            s.send(U.LK_T_MSG, slot, data, 0, len(data), True)
    atk.on_up = lambda s: s.send(U.LK_T_CHELLO, 0, b'{"distro": "evil"}', 0, 18, True, True)
    atk.every = forge
    atk.start()
    extra = ("--link-key", key_file(tmp_path)) if kind == "keyed" else ()
    g, gport = gateway_proc("udp://127.0.0.1:%d" % port, *extra)
    c: Optional[Client] = None
    try:
        c = Client(gport, "victim")
        c.subscribe(1, "/e2e_squat", S)
        got = c.wait(lambda: c.messages.get(1), 4.0)
        if kind == "keyed":
            assert not got and atk.ups == 0
            assert (c.hello_ack or {}).get("ros_distro") == "unknown"   # no ROS side at all
        else:
            assert got and atk.ups >= 1, "unkeyed: the squatter should reach the client"
    finally:
        if c is not None:
            c.close()
        atk.close()
        g.stop()


@pytest.mark.parametrize("mode", ["udp", "serial"])
def test_keyed_link_carries_data_both_ways(mode: str, tmp_path: Any, connect: Any,
                                           dds: Dds) -> None:
    b = make_bridge(mode, key_file=key_file(tmp_path))
    try:
        out, back = "/e2e_key_%s_out" % mode, "/e2e_key_%s_back" % mode
        raw = RawCollector(dds.reader("rt" + out, I.String, depth=100))
        w = dds.writer("rt" + back, I.String, depth=100)
        a, c = connect(b, "pub"), connect(b, "sub")
        a.advertise(1, out, S, dict(QOS_R, depth=100))
        c.subscribe(2, back, S, dict(QOS_R, depth=100))
        assert wait_for(lambda: both_matched(a, 1, raw.reader) and matched(w) == 1, 10)
        for i in range(50):
            a.publish(1, ser(string_msg("seq %d" % i), S))
            w.write(I.String(data="seq %d" % i))
        assert [seq_of(d) for d in raw.wait(50)] == list(range(50))
        assert c.wait(lambda: len(c.messages[2]) >= 50), len(c.messages[2])
        assert [seq_of(d) for d in c.messages[2]] == list(range(50))
        lc = b.link_counters()
        assert lc is not None and lc["auth"] == 0 and lc["replay"] == 0
        assert b.driver.s.tag == U.LK_TAG           # every frame carried the MAC trailer
    finally:
        b.close()


def test_unkeyed_udp_off_loopback_needs_insecure_link(tmp_path: Any) -> None:
    # the gateway refuses before it sends anything (192.0.2.0/24 is TEST-NET: never reached)
    g = e2e_proc([sys.executable, GATEWAY, "--listen", "127.0.0.1:0",
                  "--link", "udp://192.0.2.10:8269"])
    assert g.wait(20) == 2
    lines = [x for x in g.text().splitlines() if x.strip()]
    assert len(lines) == 1 and "--link-key" in lines[0] and "--insecure-link" in lines[0], lines
    # the companion on every address: refused, then allowed with --insecure-link (warned)
    port = free_port(socket.SOCK_DGRAM)
    p = e2e_proc(companion_argv("udp://0.0.0.0:%d" % port))
    assert p.wait(30) != 0
    assert "--insecure-link" in p.text() and "Traceback" not in p.text()
    p = e2e_proc(companion_argv("udp://0.0.0.0:%d" % port, "--insecure-link"))
    try:
        p.wait_line(r"has no key \(--insecure-link\)")
        p.wait_line(r"companion on link")
    finally:
        p.stop()
    # bad key files: one line each; a key others can read: a warning, and it runs
    bad = os.path.join(str(tmp_path), "bad.key")
    with open(bad, "w") as f:
        f.write("not hex at all, not even 32 digits\n")
    g = e2e_proc([sys.executable, GATEWAY, "--listen", "127.0.0.1:0",
                  "--link", "udp://127.0.0.1:9", "--link-key", bad])
    assert g.wait(20) == 2
    lines = [x for x in g.text().splitlines() if x.strip()]
    assert len(lines) == 1 and "link key" in lines[0], lines
    loose = key_file(tmp_path, "loose.key")
    os.chmod(loose, 0o644)
    g = e2e_proc([sys.executable, GATEWAY, "--listen", "127.0.0.1:0",
                  "--link", "udp://127.0.0.1:9", "--link-key", loose])
    try:
        g.wait_line(r"can be read by group or others")
        g.wait_line(r"listening on")
    finally:
        g.stop()
    assert re.search(r"chmod 600", g.text())

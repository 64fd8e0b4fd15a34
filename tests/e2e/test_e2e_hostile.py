"""A hostile or broken peer, through the real processes (issue 14, items 3-5).

- A raw link peer (the core's own LinkSession on a real UDP socket, so its frames are valid)
  sends malformed records to a real gateway process and to a real companion process: both count
  them, answer each with a BAD record, and keep serving.
- Churning ADVERTISE/UNADVERTISE with 60 KiB topic names (refused by the ROS side, answers in
  flight while the slots are reused) cannot cancel another client's registration.
- A newline in a client name stays on one log line.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from typing import Any, List, Optional, Tuple

import ubrb_min as U
from tests.e2e.helpers import Client, Dds, RawCollector, companion_argv, e2e_proc, matched, ser, \
    string_msg
from tests.support import ros_idl as I
from tests.support.procs import ROOT, Proc, wait_for
from tests.support.qos import QOS_R
from tests.support.raw_client import RawClient


class RawLinkPeer:
    """One end of the link on a real UDP socket, driven from the test thread: valid frames,
    whatever records the test puts in them."""

    def __init__(self, gateway: bool, peer: Optional[Tuple[str, int]] = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.peer = peer                   # the companion role learns it from the first datagram
        self.records: List[Tuple[int, int, bytes]] = []
        self.s = U.LinkSession(self, int.from_bytes(os.urandom(4), "little") % (1 << 30) or 1,
                               gateway, True)

    def now(self) -> int:
        return int(time.monotonic() * 1000)

    def pump(self, seconds: float = 0.0, until: Any = None) -> bool:
        end = time.monotonic() + seconds
        while True:
            now = self.now()
            while True:
                try:
                    data, addr = self.sock.recvfrom(65536)
                except BlockingIOError:
                    break
                self.peer = self.peer or addr
                self.s.feed(data, 0, len(data), now)
            self.s.tick(now)
            while self.peer is not None:
                n = self.s.poll_tx(now)
                if n == 0:
                    break
                self.sock.sendto(bytes(self.s.tx_buf[:n]), self.peer)
            if until is not None and until():
                return True
            if time.monotonic() >= end:
                return until is None
            time.sleep(0.002)

    def send(self, t: int, slot: int, body: Any, reliable: bool = True) -> None:
        b = body if isinstance(body, bytes) else json.dumps(body).encode()
        assert self.s.send(t, slot, b, 0, len(b), reliable, True) == U.LK_OK

    def of_type(self, t: int) -> List[Tuple[int, bytes]]:
        return [(slot, b) for tt, slot, b in self.records if tt == t]

    # link handler
    def link_up(self, fresh: bool) -> None:
        pass

    def link_down(self) -> None:
        pass

    def link_message(self, t: int, slot: int, buf: Any, off: int, n: int, reliable: bool) -> None:
        self.records.append((t, slot, bytes(buf[off:off + n])))

    def close(self) -> None:
        self.sock.close()


class GatewayProcess(Proc):
    """`python ubrb_min.py` (the CPython port) on an ephemeral loopback port."""

    def __init__(self, *args: str) -> None:
        super().__init__([sys.executable, os.path.join(ROOT, "ubrb_min.py"),
                          "--listen", "127.0.0.1:0", *args], cwd="/")
        self.port = int(self.wait_line(r"listening on [\d.]+:(\d+)", 10).group(1))

    def alive(self) -> bool:
        return self.proc.poll() is None


DEEP = b"[" * 5000 + b"]" * 5000            # CPython: RecursionError; MicroPython: no limit
# What a broken or hostile companion could send the gateway (each answered with one BAD record)
BAD_FOR_GATEWAY = [
    (U.LK_T_RESULT, 0, b"{not json"),
    (U.LK_T_RESULT, 0, b"[1, 2, 3]"),                     # killed the gateway before (a list)
    (U.LK_T_RESULT, 0, DEEP),
    (U.LK_T_ERROR, 0, b'{"kind": "pub", "code": "link_congested", "message": "\xff", "gen": 1}'),
    (U.LK_T_RESULT, 0, b'{"kind": "pub", "code": null}'),
    (U.LK_T_RESULT, 0, b'{"kind": "pub", "code": {"a": 1}, "gen": 1}'),
    (U.LK_T_CHELLO, 0, b'{"distro": 12}'),
    (U.LK_T_SUBCOUNT, 0, b"\x01"),
    (42, 7, b"unknown record type"),
]
# ... and a broken or hostile gateway could send the companion
BAD_FOR_COMPANION = [
    (U.LK_T_ADV, 1, b"{not json"),                          # killed ros_side before
    (U.LK_T_ADV, 1, b'{"type": "std_msgs/msg/String", "gen": 1}'),   # KeyError 'topic' before
    (U.LK_T_SUB, 1, b'{"topic": "/x", "type": "std_msgs/msg/String", "qos": "best", "gen": 1}'),
    (U.LK_T_SUB, 1, DEEP),
    (U.LK_T_ADV, 1, b'{"topic": "/\xc3(", "type": "std_msgs/msg/String", "gen": 1}'),
    (U.LK_T_ADV, 1, b'{"topic": "/a\\ud800", "type": "std_msgs/msg/String", "gen": 1}'),
    (U.LK_T_ADV, 1, b'{"topic": "/x", "type": "std_msgs/msg/String", "gen": -4}'),
    (U.LK_T_STATS, U.LK_STATS_SLOT, b"[]"),
    (42, 7, b"unknown record type"),
]


def test_malformed_records_from_the_companion_crash_nothing_in_the_gateway() -> None:
    peer = RawLinkPeer(gateway=False)
    gw = GatewayProcess("--link", "udp://127.0.0.1:%d" % peer.port)
    try:
        assert peer.pump(10, until=peer.s.is_up), gw.text()
        peer.send(U.LK_T_CHELLO, 0, {"distro": "kilted"})
        for t, slot, body in BAD_FOR_GATEWAY:
            peer.send(t, slot, body)
        assert peer.pump(5, until=lambda: len(peer.of_type(U.LK_T_BAD)) >= len(BAD_FOR_GATEWAY))
        assert len(peer.of_type(U.LK_T_BAD)) == len(BAD_FOR_GATEWAY)
        # the gateway serves on: a client registers, the generation comes back, data flows
        c = RawClient(gw.port)
        c.hello("after the storm")
        c.advertise(1, "/hostile_ok", "std_msgs/msg/String", QOS_R)

        def adv() -> Any:
            return peer.of_type(U.LK_T_ADV)
        assert peer.pump(5, until=adv)
        slot, body = adv()[0]
        reg = json.loads(body)
        assert reg["topic"] == "/hostile_ok" and isinstance(reg["gen"], int)
        peer.send(U.LK_T_RESULT, slot, {"kind": "pub", "code": None, "message": "",
                                        "gen": reg["gen"]})
        peer.pump(0.3)
        ack = c.expect_json(U.OP_HELLO_ACK)
        assert ack["ros_distro"] == "kilted"
        c.publish(1, b"\x00\x01\x00\x00data")
        assert peer.pump(5, until=lambda: peer.of_type(U.LK_T_PUB))
        assert peer.of_type(U.LK_T_PUB)[0][1] == b"\x00\x01\x00\x00data"
        c.close()
        assert gw.alive()
        text = gw.text()
        assert "Traceback" not in text
        # logged, at most once a second, one line each (the counts say how many were held back)
        assert 1 <= text.count("bad link record from the peer") <= 3, text
    finally:
        code = gw.stop()
        peer.close()
    assert code == 0, gw.text()


def test_malformed_records_from_the_gateway_crash_nothing_in_the_companion() -> None:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    comp = e2e_proc(companion_argv("udp://127.0.0.1:%d" % port))
    peer = RawLinkPeer(gateway=True, peer=("127.0.0.1", port))
    try:
        comp.wait_line(r"companion on link", 20)
        assert peer.pump(20, until=lambda: peer.of_type(U.LK_T_CHELLO)), comp.text()
        for t, slot, body in BAD_FOR_COMPANION:
            peer.send(t, slot, body)
        assert peer.pump(5, until=lambda: len(peer.of_type(U.LK_T_BAD)) >= len(BAD_FOR_COMPANION))
        assert len(peer.of_type(U.LK_T_BAD)) == len(BAD_FOR_COMPANION), peer.records
        # a good registration right behind them is created and answered with its generation
        peer.send(U.LK_T_ADV, 3, {"topic": "/hostile_ok", "type": "std_msgs/msg/String",
                                  "qos": QOS_R, "gen": 77})
        assert peer.pump(10, until=lambda: peer.of_type(U.LK_T_RESULT)), comp.text()
        res = json.loads(peer.of_type(U.LK_T_RESULT)[0][1])
        assert (res["kind"], res["code"], res["gen"]) == ("pub", None, 77)
        assert comp.proc.poll() is None
        assert "Traceback" not in comp.text()
    finally:
        code = comp.stop()
        peer.close()
    assert code == 0, comp.text()


def test_churn_with_huge_topic_names_cannot_cancel_another_clients_registration(dds: Dds) -> None:
    port_probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    port_probe.bind(("127.0.0.1", 0))
    lport = port_probe.getsockname()[1]
    port_probe.close()
    comp = e2e_proc(companion_argv("udp://127.0.0.1:%d" % lport))
    # 2 topic slots: the attacker's churn reuses every slot many times a second, so the victim
    # registers on a slot whose refusal (for the attacker's name) is still on its way back
    gw = GatewayProcess("--link", "udp://127.0.0.1:%d" % lport, "--max-topics", "2")
    stop = threading.Event()
    churned = [0]

    failed: List[BaseException] = []

    def churn() -> None:
        try:
            a = Client(gw.port, "attacker")   # its reader thread drains the ERRORs it gets
            a.sock.settimeout(10.0)
            name = "/" + "a" * (60 * 1024)    # valid UBRB, refused by the ROS side
            k = 0
            while not stop.is_set() and k < 150:   # <= 9 MiB: the link's backlog stays bounded
                k += 1
                a.advertise(k, name, "std_msgs/msg/String")
                a.unadvertise(k)
                churned[0] = k
            a.close()
        except BaseException as e:       # reported by the test, not lost in the thread
            failed.append(e)

    t = threading.Thread(target=churn, daemon=True)
    try:
        comp.wait_line(r"companion on link", 20)
        victim = Client(gw.port, "victim")
        t.start()
        assert wait_for(lambda: churned[0] >= 20 or failed, 20) and not failed, failed
        topic = "/e2e_victim"
        raw = RawCollector(dds.reader("rt" + topic, I.String, depth=200))
        qos = dict(QOS_R, depth=200)
        # each round registers on a slot the attacker has just used and released
        live = 0
        for rnd in range(1, 11):
            victim.advertise(rnd, topic, "std_msgs/msg/String", qos)
            # the ROS side's answer for this id: its subscriber count, or an ERROR (a stale
            # answer to the attacker's registration on this slot would be one)
            def answered(i: int = rnd) -> bool:
                return victim.count_of(i) is not None or any(e["id"] == i for e in victim.errors)
            assert victim.wait(answered, 20), (rnd, victim.errors)
            codes = [code for code, _ in victim.error_codes()]
            assert "invalid_topic" not in codes and "unknown_id" not in codes, victim.errors
            if ("link_congested", rnd) in victim.error_codes():
                continue                      # refused outright (link full), never cancelled
            live = rnd
            if rnd < 10:
                victim.unadvertise(rnd)
        assert live, "every registration was refused for a full link"
        assert wait_for(lambda: matched(raw.reader) == 1, 10)
        stop.set()
        t.join(5)
        victim.sync()
        data = [ser(string_msg("m%d" % i), "std_msgs/msg/String") for i in range(100)]
        for d in data:
            victim.publish(live, d)
        got = raw.wait(100, 30)             # behind the attacker's backlog on the link
        assert len(got) == 100
        codes = [code for code, _ in victim.error_codes()]
        assert "invalid_topic" not in codes and "unknown_id" not in codes, victim.errors
        victim.close()
        assert not failed, failed
    finally:
        stop.set()
        gw.stop()
        comp.stop()
    assert "Traceback" not in gw.text() + comp.text()


def test_a_newline_in_a_client_name_stays_on_one_log_line() -> None:
    gw = GatewayProcess("--link", "none")
    try:
        c = RawClient(gw.port)
        c.hello("ue\nCRITICAL root: forged\r\x1b[2K")
        c.expect(U.OP_HELLO_ACK)
        c.close()
        assert gw.wait_line(r"closed", 5)
    finally:
        gw.stop()
    lines = gw.text().splitlines()
    forged = [ln for ln in lines if "forged" in ln]
    assert len(forged) >= 1
    assert all("says HELLO" in ln or "closed" in ln for ln in forged), forged
    assert not any(ln.startswith("CRITICAL") for ln in lines)

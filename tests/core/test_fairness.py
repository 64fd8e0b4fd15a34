# Per-address fairness in the core: connections per client address, the frame deadline.
import json

import ubrb_min as U
import ubrb_setup
from scripted import Client, gateway
from tests.support.ubrb_frames import hello, parse_frames


def refusal(gw):
    (op, payload), = parse_frames(gw.reject_frame())
    assert op == U.OP_ERROR
    return json.loads(payload)


def test_one_address_never_takes_every_slot_by_default():
    assert ubrb_setup.make_profile("pi")["max_clients_per_address"] == 4
    assert ubrb_setup.make_profile("mcu")["max_clients_per_address"] == 1
    assert ubrb_setup.make_profile("pi", {"max_clients": 3})["max_clients_per_address"] == 2
    assert ubrb_setup.make_profile("pi", {"max_clients_per_address": 8})["max_clients_per_address"] == 8


def test_connections_per_address_are_limited_and_other_addresses_still_served():
    gw, ros = gateway(max_clients=4, max_clients_per_address=2)
    a1 = gw.accept(0, ("127.0.0.1", 40001))
    a2 = gw.accept(0, ("127.0.0.1", 40002))
    assert a1 >= 0 and a2 >= 0
    assert gw.accept(0, ("127.0.0.1", 40003)) == -1
    e = refusal(gw)
    assert e["code"] == "too_many_clients" and "--max-clients-per-address" in e["message"]
    assert gw.accept(0, ("127.0.0.2", 40004)) >= 0
    assert gw.counters()["rejected_per_address"] == 1
    gw.closed(a1, "test")  # a slot of that address comes back
    assert gw.accept(0, ("127.0.0.1", 40005)) >= 0
    # Capacity refusals still say so.
    assert gw.accept(0, ("127.0.0.3", 40006)) >= 0
    assert gw.accept(0, ("127.0.0.4", 40007)) == -1
    assert "at most 4 clients" in refusal(gw)["message"]


class Peer(Client):
    """A Client connected from `peer` (host, port), as a port hands accept() its peers."""

    def __init__(self, gw, peer, now=0):
        self.gw = gw
        self.ci = gw.accept(now, peer)
        assert self.ci >= 0, peer


def test_sessions_past_hello_never_count_against_their_address():
    # Two UE worlds on one PC with max_clients 2 (mcu): the default per-address limit (1) bounds
    # connections before HELLO only, so both worlds are served, one after the other's HELLO.
    gw, ros = gateway(max_clients=2)
    assert gw.p["max_clients_per_address"] == 1
    a = Peer(gw, ("192.0.2.7", 50001))
    a.send(hello("world A"))
    b = Peer(gw, ("192.0.2.7", 50002))
    b.send(hello("world B"))
    for c in (a, b):
        assert [op for op, _ in c.frames()] == [U.OP_HELLO_ACK]
    assert gw.counters()["rejected_per_address"] == 0
    # max_clients still bounds them, with its own message, and evicts nobody
    assert gw.accept(0, ("192.0.2.7", 50003)) == -1
    assert "at most 2 clients" in refusal(gw)["message"]
    assert gw.clients[a.ci].state == U.S_READY and gw.clients[b.ci].state == U.S_READY


def test_connections_before_hello_are_capped_per_address_until_they_say_hello():
    gw, ros = gateway(max_clients=4, max_clients_per_address=2)
    a = Peer(gw, ("127.0.0.1", 40001))
    b = Peer(gw, ("127.0.0.1", 40002))
    assert gw.accept(0, ("127.0.0.1", 40003)) == -1
    e = refusal(gw)
    assert e["code"] == "too_many_clients" and "--max-clients-per-address" in e["message"]
    assert "before HELLO" in e["message"]
    a.send(hello())  # a completes HELLO: it stops counting against 127.0.0.1
    c = Peer(gw, ("127.0.0.1", 40004))
    assert gw.accept(0, ("127.0.0.1", 40005)) == -1  # b and c: two without HELLO again
    assert gw.counters()["rejected_per_address"] == 2
    # Without HELLO in 5 s they are closed; until the port has closed them they still count
    # (a peer that does not read its ERROR cannot open new ones in their place meanwhile).
    gw.tick(5000)
    assert b.closing() and c.closing() and not a.closing()
    assert gw.accept(5000, ("127.0.0.1", 40006)) == -1
    b.close()
    assert Peer(gw, ("127.0.0.1", 40007), 5000).ci >= 0
    # A HELLO-less session from another address is not the first address's.
    assert Peer(gw, ("127.0.0.2", 40008), 5000).ci >= 0


def test_an_address_flooding_helloless_dribblers_leaves_other_addresses_served():
    # pi-sized: 8 slots, 4 HELLO-less connections per address by default. One address holds an
    # established session and floods with connections that dribble their HELLO a byte at a time.
    gw, ros = gateway(max_clients=8)
    assert gw.p["max_clients_per_address"] == 4
    mine = Peer(gw, ("10.1.1.1", 1000))
    mine.send(hello("established"))
    h = hello("dribbler")
    held = []
    for k in range(8):
        ci = gw.accept(0, ("10.1.1.1", 2000 + k))
        if ci >= 0:
            held.append(ci)
            gw.clients[ci].decoder.buf[0] = h[0]
            gw.received(ci, 1, 0)
    assert len(held) == 4  # the established session took none of them
    assert gw.counters()["rejected_per_address"] == 4
    other = Peer(gw, ("10.2.2.2", 3000))
    other.send(hello("honest"))
    assert [op for op, _ in other.frames()] == [U.OP_HELLO_ACK]
    assert [op for op, _ in mine.frames()] == [U.OP_HELLO_ACK]
    assert Peer(gw, ("10.3.3.3", 3001)).ci >= 0  # slots left for a third address too


def test_raw_sockaddr_peers_are_counted_by_address_not_port():
    # MicroPython's unix port hands accept()'s peer over as a raw sockaddr_in.
    def sockaddr(a, port):
        return bytes([2, 0, port >> 8, port & 0xFF, 127, 0, 0, a]) + bytes(8)

    gw, ros = gateway(max_clients=3, max_clients_per_address=1)
    assert gw.accept(0, sockaddr(1, 5000)) >= 0
    assert gw.accept(0, sockaddr(1, 5001)) == -1
    assert gw.accept(0, sockaddr(2, 5002)) >= 0


def test_a_frame_must_be_complete_within_frame_timeout_of_its_first_byte():
    gw, ros = gateway(frame_timeout=10)
    c = Client(gw)
    c.send(hello())
    c.frames()
    ping = U.encode_frame(U.OP_PING, b"")
    t = 0
    for k in range(len(ping) - 1):  # one byte every 4 s: never idle for 10 s, never complete
        c.send(ping[k:k + 1], now=t)
        gw.tick(t)
        if t < 10000:
            assert not c.closing(), t
        t += 4000
        gw.tick(t - 1)
    assert c.closing()
    assert "dribbling client" in c.session.close_reason
    assert c.errors() == [("protocol_error", None)]
    assert gw.counters()["closed_frame_timeout"] == 1


def test_frames_completed_in_time_restart_the_deadline():
    gw, ros = gateway(frame_timeout=10)
    c = Client(gw)
    c.send(hello())
    ping = U.encode_frame(U.OP_PING, b"")
    t = 0
    for _ in range(10):  # each frame takes 6 s to come, 60 s in all: every one in time
        c.send(ping[:5], now=t)
        gw.tick(t + 3000)
        c.send(ping[5:], now=t + 6000)
        gw.tick(t + 9999)
        t += 6000
    assert not c.closing()
    assert [op for op, _ in c.frames()].count(U.OP_PONG) == 10
    gw.tick(t + 60000 - 1)  # a complete frame leaves no deadline running (the idle one does)
    assert "dribbling" not in c.session.close_reason


def test_a_client_that_does_not_read_its_replies_is_not_read_then_closed():
    gw, ros = gateway(control_reserve=1024, slow_client_timeout=5)
    c = Client(gw)
    c.send(hello())
    c.frames()
    ping = U.encode_frame(U.OP_PING, b"")
    t = 0
    while gw.interest(c.ci) & U.WANT_READ:  # PINGs, their PONGs never read
        c.send(ping, now=t)
        t += 1
    assert t < 100  # half the control room: 512 bytes of PONGs
    gw.tick(t)
    gw.tick(t + 4999)
    assert not c.closing()
    gw.tick(t + 5000)
    assert c.closing() and "slow client" in c.session.close_reason

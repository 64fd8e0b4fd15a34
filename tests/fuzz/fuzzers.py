"""Mutational fuzzers for what comes off the wire: the UBRB decoder and client sessions, the link
frame parser, and the link record layer (both ends). Each runs a deterministic stream of inputs
(seeded), asserts that no exception escapes and that the invariants hold after every batch, and
returns how many inputs it ran. Shared by the CI tests (tests/fuzz/test_fuzz.py, bounded) and
`make fuzz` (python -m tests.fuzz.fuzzers --seconds N, longer runs).

Inputs are built from a corpus of valid frames/records and mutated (bit flips, byte
insert/delete/overwrite, truncation, splices, interesting values), plus generated JSON of every
shape, so most inputs get past the first check and reach the deeper code.
"""

from __future__ import annotations

import json
import random
import sys
import time
import zlib
from typing import Any, Callable, Dict, List, Optional

import ubrb_min as U
from ros_side.link_end import LinkCompanionEnd
from scripted import ScriptedRos, profile
from tests.support import ubrb_frames as F

INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0xFE, 0x40, 0x3F, 0x20, 0x22, 0x5C, 0x7B, 0x5B]
JSON_ATOMS: List[Any] = [None, True, False, 0, -1, 1 << 30, 1 << 31, 2 ** 64, 1.5, "", "x",
                         "/t", "\n", "\ud800", "é", "std_msgs/msg/String", "pub", "sub",
                         "reliable", "best_effort", "volatile", "transient_local",
                         "invalid_topic", "link_congested", [], {}]
KEYS = ["id", "topic", "type", "qos", "protocol", "client", "kind", "code", "message", "gen",
        "distro", "reliability", "durability", "depth", "x"]


def rand_json(r: random.Random, depth: int = 0) -> Any:
    """A JSON value of any shape; objects favour the keys the records and frames use."""
    k = r.random()
    if depth > 3 or k < 0.45:
        return r.choice(JSON_ATOMS) if r.random() < 0.7 else r.randint(-5, 70000)
    if k < 0.6:
        return [rand_json(r, depth + 1) for _ in range(r.randint(0, 3))]
    return {r.choice(KEYS): rand_json(r, depth + 1) for _ in range(r.randint(0, 5))}


def mutate(r: random.Random, data: bytes, corpus: List[bytes]) -> bytes:
    """One to four mutations of `data`."""
    b = bytearray(data)
    for _ in range(r.randint(1, 4)):
        op = r.randrange(8)
        n = len(b)
        if op == 0 and n:                                  # bit flip
            i = r.randrange(n)
            b[i] ^= 1 << r.randrange(8)
        elif op == 1 and n:                                # interesting byte
            b[r.randrange(n)] = r.choice(INTERESTING)
        elif op == 2:                                      # insert bytes
            i = r.randint(0, n)
            b[i:i] = bytes(r.randrange(256) for _ in range(r.randint(1, 4)))
        elif op == 3 and n:                                # delete a run
            i = r.randrange(n)
            del b[i:i + r.randint(1, 8)]
        elif op == 4 and n:                                # truncate
            del b[r.randrange(n):]
        elif op == 5:                                      # splice another input in
            o = r.choice(corpus)
            i = r.randint(0, n)
            b[i:i] = o[r.randrange(len(o) + 1):]
        elif op == 6 and n > 1:                            # duplicate a chunk
            i = r.randrange(n)
            b[i:i] = b[i:i + r.randint(1, 16)]
        elif op == 7 and n >= 4:                           # a 32-bit interesting value
            i = r.randrange(n - 3)
            b[i:i + 4] = r.choice([0, 1, 0x7FFFFFFF, 0xFFFFFFFF, 0x40000000]).to_bytes(4, "little")
    return bytes(b)


class Budget:
    """Stop after `n` inputs or at `deadline` (monotonic seconds), whichever comes first."""

    def __init__(self, n: int, seconds: float) -> None:
        self.n = n
        self.deadline = time.monotonic() + seconds
        self.done = 0

    def more(self, batch: int) -> bool:
        return self.done < self.n and time.monotonic() < self.deadline


# ---- 1. UBRB decoder + client sessions + the registry -----------------------------------------
def ubrb_corpus() -> List[bytes]:
    qos = {"reliability": "best_effort", "durability": "volatile", "depth": 1}
    return [
        F.hello("fuzz"), F.hello("x\ny"), F.ping(), U.encode_frame(U.OP_PONG, b""),
        F.advertise(1, "/a", "std_msgs/msg/String"), F.advertise(2, "/b", "x/msg/Y", qos),
        F.subscribe(3, "/a", "std_msgs/msg/String"), F.subscribe(4, "/c", "x/msg/Z", qos),
        F.unadvertise(1), U.encode_frame(U.OP_UNSUBSCRIBE, b'{"id": 3}'),
        F.publish(1, b"\x00\x01\x00\x00abcd"), F.publish(2, b""),
    ]


def ubrb_json_frame(r: random.Random) -> bytes:
    op = r.choice([U.OP_HELLO, U.OP_ADVERTISE, U.OP_SUBSCRIBE, U.OP_UNADVERTISE,
                   U.OP_UNSUBSCRIBE])
    obj = rand_json(r)
    if isinstance(obj, dict) and r.random() < 0.7:
        obj.setdefault("id", r.randrange(6))
        obj.setdefault("topic", r.choice(["/a", "/b", "/c", "bad topic", "/" + "a" * 300]))
        obj.setdefault("type", r.choice(["std_msgs/msg/String", "x/msg/Y", 5]))
        if op == U.OP_HELLO:
            obj["protocol"] = r.choice([1, 1, 1, 2, "1"])
    return U.encode_frame(op, json.dumps(obj).encode())


def check_gateway(gw: Any) -> None:
    """Registry and queue invariants: every slot's reference count is the number of live ids on
    it over all clients; per-client sub_refs agree; no queue exceeds its capacity; a free
    session holds nothing."""
    for kind, table in ((U.PUB, gw.pubs), (U.SUB, gw.subs)):
        refs = [0] * table.size
        for c in gw.clients:
            ids = c.pub_id if kind == U.PUB else c.sub_id
            slots = c.pub_slot if kind == U.PUB else c.sub_slot
            own = [0] * table.size
            for i in range(len(ids)):
                if ids[i] >= 0:
                    assert c.state != U.S_FREE, "a free session holds an id"
                    refs[slots[i]] += 1
                    own[slots[i]] += 1
            if kind == U.SUB:
                assert list(c.sub_refs[:table.size]) == own, "sub_refs disagree"
        assert refs == list(table.refs), "slot reference counts disagree with the ids held"
        for s in range(table.size):
            assert (table.topic[s] is None) == (table.refs[s] == 0), "slot ownership"
    for c in gw.clients:
        q = c.queue
        assert 0 <= q.pending() <= q.cap, "queue beyond its bounds"


def fuzz_ubrb(n: int, seconds: float, seed: int = 1) -> int:
    r = random.Random(seed)
    corpus = ubrb_corpus()
    ros = ScriptedRos(max_message=4096)
    gw = U.Gateway(profile(max_clients=3, max_pubs=4, max_subs=4, max_topics=4,
                           max_payload=4096, max_control=1024, queue_bytes=16384,
                           control_reserve=2048), ros=ros)
    ros.up()
    now = 0
    open_ci: List[int] = []
    b = Budget(n, seconds)
    while b.more(1):
        for _ in range(500):
            now += r.randint(0, 40)
            k = r.random()
            if not open_ci or k < 0.01:
                ci = gw.accept(now)
                if ci >= 0:
                    open_ci.append(ci)
                    gw.received(ci, 0, now)
                    data = F.hello("fuzz")
                    _feed(gw, ci, data, now)
                continue
            ci = r.choice(open_ci)
            if k < 0.02:
                gw.closed(ci, "fuzz")
                open_ci.remove(ci)
                continue
            if k < 0.06:          # the ROS side answers something about some slot
                kind = r.choice(["pub", "sub"])
                slot = r.randrange(-1, 6)
                j = r.randrange(4)
                if j == 0:
                    gw.ros_result(kind, slot, r.choice([None, "invalid_topic"]), "m")
                elif j == 1:
                    gw.ros_error(kind, slot, "message_too_large", "m")
                elif j == 2:
                    gw.ros_message(slot, b"\x00\x01\x00\x00m", 0, 5)
                else:
                    gw.ros_sub_count(slot, r.randrange(3))
                continue
            if k < 0.35:
                data = ubrb_json_frame(r)
            else:
                data = mutate(r, r.choice(corpus), corpus)
            _feed(gw, ci, data, now)
            c = gw.clients[ci]
            c.queue.sent(c.queue.pending() if r.random() < 0.8 else 0)   # the client reads
            if gw.wants_close(ci) and gw.flushed_close(ci):
                gw.closed(ci, "closed")
                open_ci.remove(ci)
            b.done += 1
        gw.tick(now)
        ros.take()
        check_gateway(gw)
    return b.done


def _feed(gw: Any, ci: int, data: bytes, now: int) -> None:
    d = gw.clients[ci].decoder
    o = 0
    while o < len(data) and not gw.wants_close(ci):
        k = min(len(data) - o, d.space())
        if k == 0:
            break
        d.buf[d.fill:d.fill + k] = data[o:o + k]
        gw.received(ci, k, now)
        o += k


# ---- 2. the link frame parser ----------------------------------------------------------------
class Sink:
    """Link handler that checks what the session delivers."""

    def __init__(self, max_message: int) -> None:
        self.max_message = max_message
        self.records = 0

    def link_up(self, fresh: bool) -> None:
        pass

    def link_down(self) -> None:
        pass

    def link_message(self, t: int, slot: int, buf: Any, off: int, n: int, reliable: bool) -> None:
        assert 0 <= t < 256 and 0 <= slot < (1 << 21) and 0 <= n <= self.max_message
        assert 0 <= off and off + n <= len(buf)
        self.records += 1


def reseal(frame: bytearray, seed: int) -> bytes:
    """Make a mutated frame valid again (length, header check, CRC with the session's seed), so
    its mutated header fields and body reach the parser's deeper code."""
    n = len(frame)
    if n < U.LK_OVH:
        return bytes(frame)
    frame[0], frame[1] = U.LK_SYNC0, U.LK_SYNC1
    frame[2], frame[3] = n & 255, n >> 8
    frame[5] = U.lk_hck(frame[2], frame[3], frame[4])
    crc = zlib.crc32(bytes(frame[:n - 4]), 0 if frame[4] & 15 == U.LK_HELLO else seed)
    frame[n - 4:] = crc.to_bytes(4, "little")
    return bytes(frame)


def link_pair(datagram: bool) -> tuple:
    kw = dict(max_message=2048, max_frame=600, rel_bytes=8192, be_bytes=4096, window=8)
    a = U.LinkSession(None, 11, True, datagram, **kw)
    b = U.LinkSession(Sink(2048), 22, False, datagram, **kw)
    a.set_handler(Sink(2048))
    return a, b


def link_corpus(a: Any, b: Any, r: random.Random, now: int) -> List[bytes]:
    """Frames a real sender makes: HELLOs, REL with whole and split records, BE, BEFRAG, ACK."""
    out: List[bytes] = []
    for step in range(60):
        now += 5
        if a.is_up() and step % 3 == 0:
            size = r.choice([0, 3, 100, 700, 1500])
            a.send(r.randrange(1, 13), r.randrange(300), bytes(size), 0, size, r.random() < 0.6,
                   False)
        for x, y in ((a, b), (b, a)):
            x.tick(now)
            while True:
                k = x.poll_tx(now)
                if not k:
                    break
                f = bytes(x.tx_buf[:k])
                if x is a:
                    out.append(f)
                y.feed(f, 0, len(f), now)
    assert a.is_up() and b.is_up()
    return out


def check_link(s: Any) -> None:
    assert 0 <= s.reliable.rel_queued <= len(s.reliable.rel), "reliable ring beyond its bounds"
    r = s.reader
    assert 0 <= r.rec_have <= len(r.rec_buf) and r.skip >= 0
    assert 0 <= r.frag_have <= len(r.frag_buf)
    assert s.datagram or 0 <= s.rx_n <= len(s.rx)


def fuzz_link_frames(n: int, seconds: float, seed: int = 2) -> int:
    r = random.Random(seed)
    b = Budget(n, seconds)
    while b.more(1):
        datagram = r.random() < 0.5
        a, s = link_pair(datagram)
        now = 1000
        corpus = link_corpus(a, s, r, now)
        now += 400
        for _ in range(2000):
            base = r.choice(corpus)
            k = r.random()
            if k < 0.5:
                data = reseal(bytearray(mutate(r, base, corpus)), s.seed)
            elif k < 0.8:
                data = mutate(r, base, corpus)
            else:   # several frames at once, cut anywhere (stream) or concatenated (datagram)
                data = b"".join(r.choice(corpus) for _ in range(r.randint(2, 4)))
                data = data[r.randrange(len(data)):]
            now += r.randint(0, 30)
            s.feed(data, 0, len(data), now)
            if r.random() < 0.05:
                s.tick(now)
                while s.poll_tx(now):
                    pass
            b.done += 1
        check_link(s)
    return b.done


# ---- 3. the record layer: both ends ----------------------------------------------------------
class CheckingCompanion:
    """The RosPort behind the companion's end: asserts it is only ever called with what the
    record checks promise (str topic and type, a dict or None qos, an int slot)."""

    distro = "fuzz"

    def __init__(self) -> None:
        self.sink: Any = None
        self.calls = 0

    def _reg(self, slot: int, topic: Any, type_: Any, qos: Any) -> None:
        assert isinstance(slot, int) and isinstance(topic, str) and isinstance(type_, str)
        assert qos is None or isinstance(qos, dict)
        topic.encode()
        self.calls += 1
        self.sink.ros_result("pub", slot, None if topic.startswith("/") else "invalid_topic", "")

    advertise = subscribe = _reg

    def unadvertise(self, slot: int) -> None:
        assert isinstance(slot, int)

    unsubscribe = unadvertise

    def publish(self, slot: int, buf: Any, off: int, n: int, reliable: bool) -> None:
        pass

    def reset(self) -> None:
        pass

    def gateway_stats(self, d: Any) -> None:
        assert isinstance(d, dict)


def record_corpus() -> Dict[int, List[bytes]]:
    reg = {"topic": "/a", "type": "std_msgs/msg/String",
           "qos": {"reliability": "reliable", "durability": "volatile", "depth": 10}, "gen": 1}
    return {
        U.LK_T_ADV: [json.dumps(reg).encode()],
        U.LK_T_SUB: [json.dumps(dict(reg, topic="/s")).encode()],
        U.LK_T_RESULT: [b'{"kind": "pub", "code": null, "message": "", "gen": 1}',
                        b'{"kind": "sub", "code": "invalid_topic", "message": "x", "gen": 2}'],
        U.LK_T_ERROR: [b'{"kind": "sub", "code": "message_too_large", "message": "", "gen": 1}'],
        U.LK_T_CHELLO: [b'{"distro": "kilted"}'],
        U.LK_T_STATS: [b'{"clients": 1}'],
        U.LK_T_SUBCOUNT: [b"\x02\x00\x00\x00\x01\x00\x00\x00"],
        U.LK_T_BAD: [b'{"type": 1, "slot": 0, "message": "x"}'],
        U.LK_T_UNADV: [b""], U.LK_T_UNSUB: [b""], U.LK_T_MSG: [b"\x00\x01\x00\x00ab"],
        U.LK_T_PUB: [b"\x00\x01\x00\x00ab"],
    }


def record_ends() -> tuple:
    """The gateway end (LinkRosPort, a real Gateway behind it) and the companion end, each on
    a session that is up (their sends are real; the fuzz feeds records to the ends directly,
    as a valid frame would deliver them)."""
    kw = dict(max_message=65536, max_frame=1400, rel_bytes=1 << 18, be_bytes=1 << 16)
    gs = U.LinkSession(None, 11, True, True, **kw)
    cs = U.LinkSession(None, 22, False, True, **kw)
    port = U.LinkRosPort(gs)
    gw = U.Gateway(profile(max_clients=2, max_pubs=4, max_subs=4, max_topics=4), ros=port)
    comp = CheckingCompanion()
    end = LinkCompanionEnd(cs, comp)
    comp.sink = end
    handshake(gs, cs)
    return gs, cs, port, gw, end, comp


def handshake(a, b, now=1000):
    """Pump two link sessions into each other until both are up; the time reached (ms)."""
    while not (a.is_up() and b.is_up()):
        now += 5
        for x, y in ((a, b), (b, a)):
            x.tick(now)
            while True:
                k = x.poll_tx(now)
                if not k:
                    break
                y.feed(x.tx_buf, 0, k, now)
    return now


def fuzz_records(n: int, seconds: float, seed: int = 3) -> int:
    r = random.Random(seed)
    corpus = record_corpus()
    flat = [b for v in corpus.values() for b in v]
    b = Budget(n, seconds)
    while b.more(1):
        gs, cs, port, gw, end, comp = record_ends()
        ci = gw.accept(0)
        # a client registration, so gateway-side answers have something to land on
        for data in (F.hello("f"), F.advertise(1, "/a", "std_msgs/msg/String"),
                     F.subscribe(2, "/s", "std_msgs/msg/String")):
            _feed(gw, ci, data, 0)
        for i in range(3000):
            t = r.choice(list(corpus)) if r.random() < 0.9 else r.randrange(256)
            k = r.random()
            if k < 0.3:
                body = json.dumps(rand_json(r)).encode()
            elif k < 0.4 and t in corpus:
                d = json.loads(corpus[t][0]) if corpus[t][0][:1] == b"{" else {}
                d[r.choice(KEYS)] = rand_json(r)
                body = json.dumps(d).encode()
            else:
                body = mutate(r, r.choice(corpus.get(t, flat)), flat)
            slot = r.choice([0, 1, 2, 3, 5, 0xFFFF, (1 << 21) - 1])
            rel = r.random() < 0.8
            if t in (U.LK_T_ADV, U.LK_T_SUB, U.LK_T_UNADV, U.LK_T_UNSUB, U.LK_T_PUB,
                     U.LK_T_STATS) or r.random() < 0.3:
                end.link_message(t, slot, body, 0, len(body), rel)
            if t not in (U.LK_T_ADV, U.LK_T_SUB) or r.random() < 0.3:
                port.link_message(t, slot, body, 0, len(body), rel)
            b.done += 1
            if i % 200 == 0:
                gw.tick(i)
                gw.clients[ci].queue.sent(gw.clients[ci].queue.pending())
                for s in (gs, cs):    # keep the send rings from filling: drain as the peer would
                    while s.poll_tx(s.now):
                        pass
        check_gateway(gw)
        assert port.c_bad + end.c_bad > 0
    return b.done


class MemoryBackend:
    """A ROS backend with no ROS: hands out handles, so the real Companion's own checks (names,
    types, QoS, conflicts, slot tables) run behind the companion's link end."""

    distro = "fuzz"

    def __init__(self) -> None:
        self.live = 0

    def create_publisher(self, topic: str, ros_type: str, qos: Any) -> Any:
        topic.encode()
        self.live += 1
        return object()

    def create_subscription(self, topic: str, ros_type: str, qos: Any, cb: Any) -> Any:
        topic.encode()
        self.live += 1
        return object()

    def destroy_publisher(self, h: Any) -> None:
        self.live -= 1

    destroy_subscription = destroy_publisher

    def publish(self, h: Any, data: bytes) -> None:
        assert type(data) is bytes

    def subscription_count(self, h: Any) -> int:
        return 1

    def close(self) -> None:
        pass


def fuzz_companion(n: int, seconds: float, seed: int = 4) -> int:
    """Records from a gateway into the companion's end with the real Companion behind it."""
    from ros_side.companion import Companion
    r = random.Random(seed)
    corpus = record_corpus()
    flat = [b for v in corpus.values() for b in v]
    types = [U.LK_T_ADV, U.LK_T_SUB, U.LK_T_UNADV, U.LK_T_UNSUB, U.LK_T_PUB, U.LK_T_STATS]
    b = Budget(n, seconds)
    while b.more(1):
        gs, cs, port, gw, end, comp = record_ends()
        backend = MemoryBackend()
        c = Companion(backend, end, 65536, diagnostics_period_ms=0)
        end.companion = c
        for i in range(3000):
            t = r.choice(types) if r.random() < 0.9 else r.randrange(256)
            k = r.random()
            if k < 0.4 and t in (U.LK_T_ADV, U.LK_T_SUB):
                d = {"topic": r.choice(["/a", "/b", "/a/b", "a", "/", "/~x", "/" + "z" * 300]),
                     "type": r.choice(["std_msgs/msg/String", "x/msg/Y", "bad", "a/b/c/d"]),
                     "qos": r.choice([None, {}, {"depth": r.choice([0, 5, -1, "x", 2 ** 40])},
                                      {"reliability": r.choice(["best_effort", "x", []])},
                                      {"durability": "transient_local"}]),
                     "gen": r.randint(1, 5)}
                if r.random() < 0.3:
                    d[r.choice(KEYS)] = rand_json(r)
                body = json.dumps(d).encode()
            elif k < 0.6:
                body = json.dumps(rand_json(r)).encode()
            else:
                body = mutate(r, r.choice(corpus.get(t, flat)), flat)
            end.link_message(t, r.randrange(6), body, 0, len(body), r.random() < 0.8)
            b.done += 1
            if i % 100 == 0:
                c.poll(i)
                while cs.poll_tx(cs.now):
                    pass
        # every live entity is one the companion still holds: for some slot of the gateway,
        # lingering for reuse after its release, or a released writer waiting for its readers
        kept = list(c._pub_slots.values()) + list(c._sub_slots.values()) + list(c._idle.values())
        held = {id(e) for e in kept}
        assert backend.live == len(held) + len(c._draining), "backend entities leaked or lost"
        assert end.c_bad > 0
        c.close(close_backend=False)
    return b.done


FUZZERS: Dict[str, Callable[[int, float, int], int]] = {
    "ubrb": fuzz_ubrb, "link_frames": fuzz_link_frames, "records": fuzz_records,
    "companion": fuzz_companion}


def main(argv: Optional[List[str]] = None) -> int:
    """`make fuzz`: every fuzzer for --seconds each (default 120), fresh seeds each run."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m tests.fuzz.fuzzers")
    p.add_argument("--seconds", type=float, default=120.0, help="per fuzzer")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("only", nargs="*", choices=[[]] + list(FUZZERS), help="fuzzers to run")
    a = p.parse_args(argv)
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    for name in a.only or FUZZERS:
        t0 = time.monotonic()
        n = FUZZERS[name](1 << 62, a.seconds, seed)
        dt = time.monotonic() - t0
        print("%-12s %9d inputs in %5.1f s (%.0f/s), seed %d" % (name, n, dt, n / dt, seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())

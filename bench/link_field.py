"""The link in the field (issue 20), through the real processes: the gateway (``python
ubrb_min.py``), the companion (``python -m ros_side --backend dds``) and a UBRB client process
(``bench/link_field.py writer``, a UE world's stand-in) offering a reliable stream of 1 KiB
std_msgs/String at a fixed rate to an independent cyclonedds reader (reliable, deep queue),
across an impaired link:

    mixed       UDP, 5 % drop + 5 % duplication + 5 % reordered within 8 + 0-20 ms delay
    reorder     UDP, 5 % of the datagrams held back behind 1..8 later ones, nothing else
    loss5       UDP, 5 % loss          loss20   UDP, 20 % loss
    dup5        UDP, 5 % duplication   delay    UDP, 0-20 ms delay keeping the order (both held
                before issue 20 and must keep holding)
    blackout3   UDP, nothing crosses for 3 s mid-stream      blackout10   the same for 10 s
    kill9       UDP, the companion killed (SIGKILL) mid-stream, restarted 0.5 s later
    pull4       serial 921,600 baud, the gateway's adapter unplugged for 4 s (the device
                vanishes and comes back at the same path)
    cut4        serial 921,600 baud, the cable between the adapters cut for 4 s (bytes vanish)
    ber1e-3     serial 921,600 baud, every bit flipped with probability 1e-3 (both ways)
    ber1e-4     the same at 1e-4
    udp         the clean UDP link, for comparison       serial   the clean 921,600 baud line

The impairments are tools/impair.py (UdpImpairProxy between the two UDP ends; BerLine, a pty line
paced at baud/10 bytes/s with independent bit errors) and tools/ptyline.py (unplug/plug). Per
condition it prints: offered (rate x seconds), written by the client, unsent (the client could not
write them within --late s of their time: the gateway's backpressure; not delivered), delivered
(distinct sequence numbers at the reader), missing (written, not delivered after the drain;
the first ranges named), duplicates (by cause, from each sample's DDS writer: a restarted
companion's latched re-publish, a record the gateway re-sent because the old companion's
acknowledgement never came, or one writer delivering twice) and out-of-order arrivals, msg/s (steady: between the 10 % and 90 % arrival), p50/p99
latency (due time in the payload -> arrival at the reader, client-side waiting included), the
ERROR codes the client got, the gateway's and the companion's link counters (retx, timeouts,
fast_retx, ooo, dup, ... from the tables they log when stopped) and what the proxy or line did;
for serial the line's physical limit: baud/10 B/s and the best payload share a frame with 15 B of
overhead reaches at that bit error rate. Issue 20's targets beside them.

The DDS side is the same for every condition: QoS reliable, transient_local, depth 2000 (the
client's ADVERTISE and the reader), so that a companion's new DDS writer (kill9) hands the reader
what it wrote before discovery matched them: a loss there is the link's, not discovery's.

    .venv/bin/python bench/link_field.py [--seconds 10] [--rate R] [CONDITION ...]

Each condition starts its own chain; ~10 s of offered load plus up to --drain s of drain.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "ports", "cpython"))  # ubrb_host
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import chainkit as K  # noqa: E402
from tools.impair import BerLine, UdpImpairProxy  # noqa: E402
from ubrb_client import frames as F  # noqa: E402
from ubrb_host import cli as host_cli  # noqa: E402

SIZE = 1024
SERIAL_BAUD = 921_600
FRAME_OVERHEAD = 15            # bytes a link frame adds, for the physical limit (issue 20)
QOS_FIELD: Dict[str, Any] = {"reliability": "reliable", "durability": "transient_local",
                             "depth": 2000}
# the companion reserves depth x --max-message per topic: 2000 x 4 KiB
COMPANION_ARGS = ("--max-message", "4096")

# name: link ("udp" or "serial"), proxy impairment, event, default rate (msg/s); the targets of
# issue 20 ("delivered": share of the offered delivered exactly once in order; "p99" s;
# "missing": written but never delivered; "payload": share of the line rate)
CONDITIONS: Dict[str, Dict[str, Any]] = {
    "udp": dict(link="udp", impair={}, rate=1000),
    "mixed": dict(link="udp", rate=1000, impair=dict(loss=0.05, dup=0.05, reorder=0.05, depth=8,
                                                     delay=(0.0, 0.020)),
                  target=dict(delivered=0.95, p99=0.25)),
    "reorder": dict(link="udp", rate=1000, impair=dict(reorder=0.05, depth=8),
                    target=dict(delivered=0.95, p99=0.25)),
    "loss5": dict(link="udp", rate=1000, impair=dict(loss=0.05),
                  target=dict(delivered=0.95, p99=0.25)),
    "loss20": dict(link="udp", rate=1000, impair=dict(loss=0.20),
                   target=dict(delivered=0.95, p99=1.0)),
    "dup5": dict(link="udp", rate=1000, impair=dict(dup=0.05),
                 target=dict(delivered=0.95, p99=0.25)),
    "delay": dict(link="udp", rate=1000, impair=dict(delay=(0.0, 0.020)),
                  target=dict(delivered=0.95, p99=0.25)),
    "blackout3": dict(link="udp", rate=1000, impair={}, blackout=3.0, target=dict(missing=0)),
    "blackout10": dict(link="udp", rate=1000, impair={}, blackout=10.0, target=dict(missing=0)),
    "kill9": dict(link="udp", rate=1000, kill9=0.5, target=dict(missing=0, restart=True)),
    "serial": dict(link="serial", rate=100),
    "pull4": dict(link="serial", rate=40, pull=4.0, target=dict(missing=0)),
    "cut4": dict(link="serial", rate=40, cut=4.0, target=dict(missing=0)),
    "ber1e-3": dict(link="serial", rate=100, ber=1e-3, target=dict(payload=0.30)),
    "ber1e-4": dict(link="serial", rate=100, ber=1e-4, target=dict(payload=0.60)),
}
LINK_SHOWN = ("tx_frames", "retx", "timeouts", "fast_retx", "ooo", "dup", "crc_err", "hdr_err",
              "drop_rel_full", "drop_down", "rel_reset_bytes", "rel_kept_bytes", "up", "down",
              "new")


# -- the payload: a String whose text carries the sequence number and the time it was due ---------
def field_cdr(seq: int, due_us: int, size: int) -> bytes:
    """The CDR of message ``seq``, due at ``due_us`` (monotonic clock, microseconds)."""
    head = b"0:%d:%d:" % (seq, due_us)
    return K.string_cdr(head + b"x" * (size - 9 - len(head)))


def field_tag(cdr: bytes) -> Tuple[int, int]:
    """(seq, due_us) of a field_cdr; ValueError when it is not one."""
    _, seq, due, _ = K.string_of(cdr).split(b":", 3)
    return int(seq), int(due)


def physical_payload_share(ber: float, overhead: int = FRAME_OVERHEAD) -> float:
    """The best share of a line's bytes that can be payload when each bit fails with probability
    ``ber`` and a frame adds ``overhead`` bytes: max over the payload P of
    P / (P + H) x (1 - ber) ** (8 (P + H)) (acknowledgements not counted)."""
    if ber <= 0:
        return 1.0
    return max(p / (p + overhead) * (1 - ber) ** (8 * (p + overhead)) for p in range(1, 4096))


# -- the client process ---------------------------------------------------------------------------
class PacedClient(K.RawClient):
    """A UBRB client offering message i at t0 + i / rate. Writes never block: a message waits in
    the client's queue until the socket takes it, and one still not started ``late`` s after its
    time is given up (unsent), as a UE world that cannot hold its frames forever. The gateway's
    backpressure (it stops reading a client the link cannot carry) shows up here. Every write,
    the reader thread's PONGs included, goes through ``out`` and one writer."""

    def __init__(self, port: int) -> None:
        self.out = bytearray()
        self.buffered = False
        super().__init__(port, "field")

    def send(self, data: bytes) -> None:
        if not self.buffered:
            super().send(data)
            return
        with self.lock:
            self.out += data

    def _flush(self) -> bool:
        with self.lock:
            if not self.out:
                return False
            try:
                n = self.sock.send(self.out, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                n = 0
            del self.out[:n]
            return n > 0

    def offer(self, rate: float, seconds: float, size: int, late: float,
              stopping: "SignalFlag") -> Dict[str, Any]:
        self.buffered = True
        total = int(rate * seconds)
        t0 = time.monotonic()
        q: Deque[Tuple[int, float]] = deque()
        unsent: List[int] = []
        written = 0
        i = 0
        # until the last message is in the socket: one still in `out` was never sent
        while (i < total or q or self.out) and not stopping.is_set():
            now = time.monotonic()
            while i < total and t0 + i / rate <= now:
                q.append((i, t0 + i / rate))
                i += 1
            while q and q[0][1] < now - late:
                unsent.append(q.popleft()[0])
            with self.lock:
                while q and len(self.out) < 2048:   # committed frames: no more than ~2 ahead
                    s, due = q.popleft()
                    self.out += F.encode_data_frame(F.PUBLISH, 1,
                                                    field_cdr(s, int(due * 1e6), size))
                    written += 1
            if self._flush():
                continue
            nxt = t0 + i / rate if i < total else now + 0.01
            wait = max(0.0005, min(0.01, nxt - now))
            if self.out:                          # the socket is full: until it takes more
                select.select([], [self.sock], [], wait)
            else:                                 # nothing to write: until the next is due
                stopping.wait(wait)
        return {"offered": total, "written": written, "unsent": ranges(unsent), "t0": t0}

    def drain(self, stopping: "SignalFlag") -> None:
        """Keep writing what is committed (and PONGs) until told to stop."""
        while not stopping.is_set():
            if self._flush():
                continue
            if self.out:
                select.select([], [self.sock], [], 0.01)
            else:
                stopping.wait(0.01)


class SignalFlag:
    """Set from a signal handler. Not a threading.Event: its set() takes the lock that the main
    thread may hold inside wait() when the signal lands there, and the writer then hung for good
    (it never printed its 'errors:' line after SIGTERM)."""

    def __init__(self) -> None:
        self.on = False

    def set(self) -> None:
        self.on = True

    def is_set(self) -> bool:
        return self.on

    def wait(self, seconds: float) -> bool:
        if not self.on:
            time.sleep(seconds)
        return self.on


def ranges(seqs: List[int]) -> List[Tuple[int, int]]:
    out: List[Tuple[int, int]] = []
    for s in seqs:
        if out and out[-1][1] == s - 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def _writer_main(argv: List[str]) -> int:
    ap = host_cli.Parser(prog="bench/link_field.py writer",
                         description="the UBRB client of bench/link_field.py: advertises TOPIC, "
                                     "prints 'ready', offers RATE msg/s for SECONDS on SIGUSR1, "
                                     "prints what it did, stays connected until SIGTERM")
    ap.add_argument("--port", type=host_cli.port_number, required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--seconds", type=host_cli.duration, required=True)
    ap.add_argument("--size", type=host_cli.positive_int, default=SIZE)
    ap.add_argument("--late", type=host_cli.duration, default=2.0)
    a = ap.parse_args(argv)
    go, stopping = SignalFlag(), SignalFlag()
    signal.signal(signal.SIGUSR1, lambda *_: go.set())
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    c = PacedClient(a.port)
    c.advertise(1, a.topic, QOS_FIELD)
    if not c.sync():
        print("no PONG from the gateway", flush=True)
        return 1
    print("ready", flush=True)
    while not go.wait(0.1):
        if stopping.is_set():
            return 1
    r = c.offer(a.rate, a.seconds, a.size, a.late, stopping)
    print("offered " + json.dumps(r), flush=True)
    # connected until told: what the gateway holds back is still this connection's
    c.drain(stopping)
    print("errors: %s" % json.dumps([e.get("code", "?") for e in c.errors]), flush=True)
    c.close()
    return 0


# -- one condition --------------------------------------------------------------------------------
def dds_reader(topic: str) -> Any:
    from cyclonedds.qos import Policy, Qos
    from cyclonedds.sub import DataReader
    qos = Qos(Policy.Reliability.Reliable(10 ** 10), Policy.Durability.TransientLocal,
              Policy.History.KeepLast(1 << 17),
              Policy.ResourceLimits(max_samples=-1, max_instances=-1, max_samples_per_instance=-1))
    return DataReader(K.participant(), K.string_topic(topic), qos=qos)


def offered_seconds(cond: Dict[str, Any], seconds: float, event_at: float,
                    tail: float = 4.0) -> float:
    """Long enough that the stream runs on for ``tail`` s after the condition's outage."""
    outage = cond.get("blackout") or cond.get("pull") or cond.get("cut") or cond.get("kill9") or 0
    return max(seconds, event_at + outage + tail) if outage else seconds


def run_condition(name: str, seconds: float = 10.0, rate: Optional[float] = None,
                  size: int = SIZE, seed: int = 1, drain: float = 10.0, late: float = 2.0,
                  event_at: float = 3.0, tail: float = 4.0, baud: int = SERIAL_BAUD,
                  impair: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Run one condition through fresh processes; the figures as a dict (see the docstring).
    An outage starts ``event_at`` s into the offered load, which goes on ``tail`` s after it;
    ``impair`` overrides some of a proxied condition's Impairment arguments."""
    cond = dict(CONDITIONS[name])
    if impair and "impair" in cond:
        cond["impair"] = dict(cond["impair"], **impair)
    rate = rate or float(cond["rate"])
    seconds = offered_seconds(cond, seconds, event_at, tail)
    topic = "/field/" + "".join(ch if ch.isalnum() else "_" for ch in name)
    proxy: Optional[UdpImpairProxy] = None
    line: Any = None
    r: Dict[str, Any] = {"condition": name, "rate": rate, "seconds": seconds, "size": size,
                         "impair": cond.get("impair")}
    if cond["link"] == "udp":
        kw: Dict[str, Any] = {}
        if "impair" in cond:
            def via(comp_port: int) -> int:
                nonlocal proxy
                proxy = UdpImpairProxy(("127.0.0.1", comp_port), seed, **cond["impair"])
                return proxy.port
            kw["udp_via"] = via
        chain = K.Chain(companion_args=COMPANION_ARGS, **kw)
    else:
        r["baud"] = baud
        if cond.get("ber"):
            line = BerLine(baud, cond["ber"], seed)
        chain = K.Chain(baud, companion_args=COMPANION_ARGS, line=line)
        line = chain.line
    w: Optional[K.Proc] = None
    reader = dds_reader(topic)
    try:
        w = K.Proc([sys.executable, os.path.join(K.ROOT, "bench", "link_field.py"), "writer",
                    "--port", str(chain.port), "--topic", topic, "--rate", str(rate),
                    "--seconds", str(seconds), "--size", str(size), "--late", str(late)])
        w.wait_line(r"^ready", 30.0)
        if not K.wait_for(lambda: K.matched(reader) >= 1, 30.0):
            raise RuntimeError("the companion's writer never matched the reader")
        col = K.Collector(reader, writers=True)
        os.kill(w.pid, signal.SIGUSR1)
        t_go = time.monotonic()
        event = threading.Thread(target=_event, args=(cond, chain, proxy, line, t_go + event_at),
                                 daemon=True)
        event.start()
        res = json.loads(w.wait_line(r"^offered (.*)$", seconds + late + 60).group(1))
        event.join(30)
        unsent = {s for a, b in res["unsent"] for s in range(a, b + 1)}
        written = res["written"]
        # drain: until everything written has arrived, or nothing more for 3 s, or --drain s
        # (distinct messages: a restarted companion's duplicates must not end it early)
        t_end = time.monotonic() + drain
        last_n, last_t = -1, time.monotonic()
        distinct: set = set()
        looked = 0
        while time.monotonic() < t_end:
            n = col.count()
            for _, d in col.got[looked:n]:
                try:
                    distinct.add(field_tag(d)[0])
                except ValueError:
                    pass
            looked = n
            if len(distinct - unsent) >= written:  # (written: the unsent are not in it)
                break
            if n != last_n:
                last_n, last_t = n, time.monotonic()
            elif time.monotonic() - last_t > 3.0:
                break
            time.sleep(0.05)
        if len(distinct - unsent) < written:
            r["stuck"] = where_stuck(chain, col, distinct, unsent, written)
        got = col.stop()
        w.proc.send_signal(signal.SIGTERM)
        r["errors"] = json.loads(w.wait_line(r"^errors: (.*)$", 10.0).group(1))
    finally:
        if w is not None:
            w.stop()
        reader.__del__()
        gw_out = chain.close()
        if proxy is not None:
            proxy.close()
        if os.environ.get("LINK_FIELD_LOGS"):
            sys.stderr.write("--- gateway\n%s\n--- companion\n%s\n" % (
                gw_out, chain.comp.output() if chain.comp else ""))
    r["gw_link"] = K.last_counters(gw_out, "link")
    r["gw"] = K.last_counters(gw_out, "gateway")
    r["comp_link"] = K.last_counters(chain.comp.output(), "link") if chain.comp else {}
    r["comp"] = K.last_counters(chain.comp.output(), "companion") if chain.comp else {}
    r.update(score(got, res, unsent, col.writers or [], r["comp"].get("latched_restored", 0)))
    if proxy is not None:
        r["proxy"] = proxy.counts()
    if line is not None:
        r["line_Bps"] = baud / 10.0
        r["line_moved"] = list(line.moved)
        if isinstance(line, BerLine):
            r["flips"] = list(line.flips)
            r["measured_ber"] = [f / b if b else 0.0 for f, b in zip(line.flips, line.bits)]
        r["payload_share"] = r["per_s"] * size / (baud / 10.0)
        r["physical_share"] = physical_payload_share(cond.get("ber", 0.0))
    r["target"] = cond.get("target", {})
    r["met"] = met(r)
    return r


def where_stuck(chain: K.Chain, col: Any, distinct: set, unsent: set, written: int,
                wait: float = 10.0) -> Dict[str, Any]:
    """Messages written are still missing after the drain: where are they? The gateway's and
    the companion's live counters (SIGUSR1) and the TCP queues of the client's connection now,
    then whether they arrive within ``wait`` more seconds (late: held somewhere that a later
    event releases) or only at the stop (the stop's drain released them)."""
    outs = []
    for p in (chain.gw, chain.comp):
        if p is not None:
            outs.append(len(p.output()))
            os.kill(p.pid, signal.SIGUSR1)
    time.sleep(0.5)
    snap: Dict[str, Any] = {}
    for who, p, n in zip(("gw", "comp"), (chain.gw, chain.comp), outs):
        text = p.output()[n:] if p is not None else ""
        snap[who] = {g: K.last_counters(text, g) for g in ("gateway", "link", "companion")
                     if K.last_counters(text, g)}
    try:
        ss = subprocess.run(["ss", "-tnoiH", "( sport = :%d or dport = :%d )"
                             % (chain.port, chain.port)], capture_output=True, text=True,
                            timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        ss = "ss: %s" % e
    missing = written - len(distinct - unsent)
    t0 = time.monotonic()
    late: List[float] = []
    looked = col.count()
    while time.monotonic() - t0 < wait and len(late) < missing:
        n = col.count()
        for _, d in col.got[looked:n]:
            try:
                s = field_tag(d)[0]
            except ValueError:
                continue
            if s not in distinct and s not in unsent:
                distinct.add(s)
                late.append(round(time.monotonic() - t0, 3))
        looked = n
        time.sleep(0.05)
    return {"counters": snap, "tcp": ss, "arrived_later_s": late, "missing": missing}


def _event(cond: Dict[str, Any], chain: K.Chain, proxy: Optional[UdpImpairProxy], line: Any,
           at: float) -> None:
    """The condition's outage, ``at`` (monotonic s)."""
    time.sleep(max(0.0, at - time.monotonic()))
    if cond.get("blackout") and proxy is not None:
        proxy.blackout(cond["blackout"])
    elif cond.get("pull"):
        line.unplug("gw")
        time.sleep(cond["pull"])
        line.plug("gw")
    elif cond.get("cut"):
        line.blackhole = True
        time.sleep(cond["cut"])
        line.blackhole = False
    elif cond.get("kill9") and chain.comp is not None:
        chain.comp.proc.kill()                      # SIGKILL
        chain.comp.proc.wait(5)
        time.sleep(cond["kill9"])
        chain.start_companion()


def score(got: List[Tuple[float, bytes]], res: Dict[str, Any], unsent: set,
          writers: Sequence[int] = (), replayed: int = 0) -> Dict[str, Any]:
    """The figures of what the reader got. ``writers``: the DDS writer of each sample (a
    restarted companion has a new one); ``replayed``: how many samples the companion published
    again from its latched state (ros_side/latched.py: the first ones of its new writer). A
    duplicate is counted by its cause: ``dup_latched``, in that re-publish (every reader that
    stayed gets the new writer's history again); ``dup_resent``, from a later writer than the
    first copy's (a record the old companion had written to ROS whose acknowledgement never
    reached the gateway, which sent it again: issue 20 allows these); ``dup_same_writer``, one
    writer delivering a message twice (the link or the companion: never right)."""
    seen: Dict[int, int] = {}
    first_by: Dict[int, Any] = {}
    lat: List[float] = []
    times: List[float] = []
    top = -1
    ooo = corrupt = 0
    per_writer: Dict[Any, int] = {}       # samples so far from each writer
    order: List[Any] = []                 # the writers, in the order they first delivered
    dup_latched = dup_resent = dup_same = 0
    for k, (t, d) in enumerate(got):
        wr = writers[k] if k < len(writers) else None
        if wr not in per_writer:
            per_writer[wr] = 0
            order.append(wr)
        per_writer[wr] += 1
        try:
            s, due = field_tag(d)
            ok = d == field_cdr(s, due, len(d))
        except ValueError:
            ok = False
        if not ok:                        # accepted with a bit flipped somewhere
            corrupt += 1
            continue
        seen[s] = seen.get(s, 0) + 1
        if seen[s] > 1:
            if wr == first_by[s]:
                dup_same += 1
            elif wr != order[0] and per_writer[wr] <= replayed:
                dup_latched += 1
            else:
                dup_resent += 1
            continue
        first_by[s] = wr
        if s < top:
            ooo += 1
        top = max(top, s)
        lat.append(t - due / 1e6)
        times.append(t)
    written = res["written"]
    delivered = len(seen)
    pc = K.percentiles(lat)
    span = (times[-1] - res["t0"]) if times else 0.0
    gone = [s for s in range(res["offered"]) if s not in seen and s not in unsent]
    return {"offered": res["offered"], "written": written, "unsent": len(unsent),
            "delivered": delivered, "missing": written - sum(1 for s in seen if s not in unsent),
            "missing_seqs": ranges(gone)[:8], "writers": len(order),
            "duplicates": sum(v - 1 for v in seen.values()), "dup_latched": dup_latched,
            "dup_resent": dup_resent, "dup_same_writer": dup_same, "out_of_order": ooo,
            "corrupt": corrupt,
            "delivered_unsent": sum(1 for s in seen if s in unsent),   # must stay 0
            "per_s": K.steady_rate(times), "whole_per_s": delivered / span if span > 0 else 0.0,
            "p50": pc.get("p50"), "p99": pc.get("p99"), "max": pc.get("max")}


def met(r: Dict[str, Any]) -> Optional[bool]:
    t = r.get("target") or {}
    if not t:
        return None
    ok = True
    if "delivered" in t:
        ok = ok and r["delivered"] >= t["delivered"] * r["offered"] and r["duplicates"] == 0 \
            and r["out_of_order"] == 0 and r["p99"] is not None and r["p99"] <= t["p99"]
    if "missing" in t:
        # a restarted companion: the duplicates of its re-publish and of the gateway's re-send
        # are allowed (see score); a duplicate from one writer never is
        dup = r["dup_same_writer"] if t.get("restart") else r["duplicates"]
        ok = ok and r["missing"] == 0 and dup == 0 and not r["gw"].get("dropped_no_ros")
    if "payload" in t:
        ok = ok and r.get("payload_share", 0.0) >= t["payload"]
    return bool(ok)


# -- printing --------------------------------------------------------------------------------------
def ms(v: Optional[float]) -> str:
    return "-" if v is None else "%.0f" % (v * 1000)


def fmt(r: Dict[str, Any]) -> str:
    lines = ["%s: offered %d (%.0f msg/s x %.0f s), written %d, unsent %d, delivered %d "
             "(%.1f %% of offered), missing %d, duplicates %d, out of order %d, corrupt %d"
             % (r["condition"], r["offered"], r["rate"], r["seconds"], r["written"], r["unsent"],
                r["delivered"], 100.0 * r["delivered"] / max(1, r["offered"]), r["missing"],
                r["duplicates"], r["out_of_order"], r["corrupt"])]
    lines.append("    %.0f msg/s steady (%.0f whole run), latency p50 %s / p99 %s / max %s ms"
                 % (r["per_s"], r["whole_per_s"], ms(r["p50"]), ms(r["p99"]), ms(r["max"])))
    if r["missing"]:
        lines.append("    missing: %s" % ", ".join("%d" % a if a == b else "%d-%d" % (a, b)
                                                   for a, b in r["missing_seqs"]))
    if r["duplicates"] or r["writers"] > 1:
        lines.append("    %d DDS writer(s); duplicates by cause: %d latched re-publish (the new "
                     "writer's history: ros_side/latched.py, %d samples), %d re-sent by the "
                     "gateway (written to ROS, not acknowledged), %d from one writer"
                     % (r["writers"], r["dup_latched"], r["comp"].get("latched_restored", 0),
                        r["dup_resent"], r["dup_same_writer"]))
    if "line_Bps" in r:
        lines.append("    line %d baud: %.0f B/s, %.0f msg/s of %d B if all were payload; payload "
                     "%.1f %% of the line (physical optimum with a %d B frame overhead: %.0f %%)"
                     % (r["baud"], r["line_Bps"], r["line_Bps"] / r["size"], r["size"],
                        100 * r["payload_share"], FRAME_OVERHEAD, 100 * r["physical_share"]))
    if "flips" in r:
        lines.append("    bits flipped %d / %d (measured BER %.2g / %.2g)"
                     % (r["flips"][0], r["flips"][1], r["measured_ber"][0], r["measured_ber"][1]))
    for who, key in (("gateway link", "gw_link"), ("companion link", "comp_link")):
        c = r.get(key) or {}
        lines.append("    %s: %s" % (who, ", ".join("%s %d" % (k, c[k]) for k in LINK_SHOWN
                                                    if c.get(k)) or "-"))
    c = {k: v for k, v in (r.get("comp") or {}).items()
         if k in ("pub_msgs", "pub_dropped", "pub_errors", "history_drops", "latched_restored")}
    if c:
        lines.append("    companion (the last one): " + ", ".join("%s %d" % kv
                                                              for kv in sorted(c.items())))
    gw = {k: v for k, v in (r.get("gw") or {}).items()
          if k in ("dropped_no_ros", "dropped_queue", "errors_sent", "closed_slow")}
    if gw:
        lines.append("    gateway: " + ", ".join("%s %d" % kv for kv in sorted(gw.items())))
    if r.get("errors"):
        lines.append("    ERROR frames to the client: %s" % ", ".join(r["errors"]))
    if r.get("stuck"):
        st = r["stuck"]
        lines.append("    STUCK after the drain: %d missing; %d arrived in the next 10 s (at %s s); "
                     "live counters %s; tcp %s" % (st["missing"], len(st["arrived_later_s"]),
                                                   st["arrived_later_s"], st["counters"],
                                                   st["tcp"].replace("\n", " | ")))
    if "proxy" in r:
        lines.append("    impairment each way: " + ", ".join("%s %s" % kv
                                                         for kv in r["impair"].items()))
        lines.append("    proxy: " + "; ".join("%s %s" % (d, ", ".join(
            "%s %d" % kv for kv in c.items() if kv[1])) for d, c in r["proxy"].items()))
    if r.get("target"):
        lines.append("    issue 20 target %s: %s" % (
            ", ".join("%s %s" % kv for kv in r["target"].items()),
            "met" if r["met"] else "NOT met"))
    return "\n".join(lines)


def summary(rs: List[Dict[str, Any]]) -> str:
    head = "%-11s %7s %7s %7s %9s %7s %5s %5s %8s %7s %7s %6s %6s" % (
        "condition", "offered", "unsent", "deliv", "msg/s", "missing", "dup", "ooo", "p50 ms",
        "p99 ms", "retx", "RTOs", "target")
    out = [head]
    for r in rs:
        c = r.get("gw_link") or {}
        out.append("%-11s %7d %7d %7d %9.0f %7d %5d %5d %8s %7s %7d %6d %6s" % (
            r["condition"], r["offered"], r["unsent"], r["delivered"], r["per_s"], r["missing"],
            r["duplicates"], r["out_of_order"], ms(r["p50"]), ms(r["p99"]), c.get("retx", 0),
            c.get("timeouts", 0), {None: "-", True: "met", False: "NOT"}[r["met"]]))
    return "\n".join(out)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["writer"]:
        return _writer_main(argv[1:])
    ap = host_cli.script_parser("bench/link_field.py", __doc__ or "")
    ap.add_argument("conditions", nargs="*", metavar="CONDITION",
                    help="any of: %s (default: all)" % " ".join(CONDITIONS))
    ap.add_argument("--seconds", type=host_cli.duration, default=10.0,
                    help="seconds of offered load per condition (longer where an outage needs "
                         "it: the outage + 4 s after it)")
    ap.add_argument("--rate", type=float, default=None,
                    help="offered msg/s (default: 1000 on UDP, 40 on the serial line, 100 at a "
                         "bit error rate: above the line's 90)")
    ap.add_argument("--drain", type=host_cli.duration, default=10.0,
                    help="at most this long for what was written to arrive after the offer ends")
    ap.add_argument("--late", type=host_cli.duration, default=2.0,
                    help="the client gives a message up (unsent) when it could not start writing "
                         "it this long after its time")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--loss", type=float, help="override the proxied conditions' loss (0..1)")
    ap.add_argument("--dup", type=float, help="... their duplication (0..1)")
    ap.add_argument("--reorder", type=float,
                    help="... the share of datagrams held back (0..1; 0.05 in mixed and reorder)")
    ap.add_argument("--depth", type=int, help="... how many later ones a held one waits for (8)")
    ap.add_argument("--delay-ms", type=float, help="... the random delay's upper bound, ms")
    ap.add_argument("--json", action="store_true", help="also print each result as JSON")
    a = ap.parse_args(argv)
    names = a.conditions or list(CONDITIONS)
    bad = [n for n in names if n not in CONDITIONS]
    if bad:
        ap.error("unknown condition %s (known: %s)" % (", ".join(bad), " ".join(CONDITIONS)))
    print("link in the field: reliable %d B std_msgs/String, DDS domain %d (loopback only); "
          "cores: %d (load average %.1f: the machine may be shared)"
          % (SIZE, K.DOMAIN, os.cpu_count() or 0, os.getloadavg()[0]), flush=True)
    over: Dict[str, Any] = {k: getattr(a, k) for k in ("loss", "dup", "reorder", "depth")
                            if getattr(a, k) is not None}
    if a.delay_ms is not None:
        over["delay"] = (0.0, a.delay_ms / 1000.0)
    rs = []
    for n in names:
        r = run_condition(n, a.seconds, a.rate, seed=a.seed, drain=a.drain, late=a.late,
                          impair=over)
        rs.append(r)
        print(fmt(r), flush=True)
        if a.json:
            print(json.dumps(r, default=str), flush=True)
    print(summary(rs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

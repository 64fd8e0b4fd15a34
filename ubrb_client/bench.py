"""Round-trip / throughput benchmark for a UBRB bridge (``python -m ubrb_client bench``).

Payload: std_msgs/msg/UInt8MultiArray whose data starts with the sequence number (u64 LE) and the
send time (u64 LE, ns, this process's monotonic clock), padded to ``size`` bytes. The CDR is
built by hand (no per-message rosbags call), so the client itself is not the bottleneck.

Round trip: publish on /ubrb_bench/ping and subscribe /ubrb_bench/pong, where a ROS-side echo
republishes every message unchanged; or ``--loopback``: publish and subscribe the same topic, the
bridge's own ROS subscription receives what its ROS publisher sends.
"""
from __future__ import annotations

import json
import math
import struct
import threading
import time

BENCH_TYPE = "std_msgs/msg/UInt8MultiArray"
PING_TOPIC = "/ubrb_bench/ping"
PONG_TOPIC = "/ubrb_bench/pong"
LOOP_TOPIC = "/ubrb_bench/loop"
_HEAD = struct.Struct("<4sIII")      # encapsulation, dim count 0, data_offset 0, data length
_STAMP = struct.Struct("<QQ")        # seq, send time ns
MIN_SIZE = _STAMP.size
PROBE = 1 << 63                      # seq flag of warm-up probes


def make_payload(seq: int, size: int, t_ns: int | None = None, pad: bytes = b"") -> bytes:
    """CDR of a UInt8MultiArray with ``size`` data bytes: seq and send time first."""
    size = max(size, MIN_SIZE)
    if t_ns is None:
        t_ns = time.perf_counter_ns()
    if len(pad) < size - MIN_SIZE:
        pad = bytes(size - MIN_SIZE)
    return (_HEAD.pack(b"\x00\x01\x00\x00", 0, 0, size) + _STAMP.pack(seq, t_ns)
            + pad[:size - MIN_SIZE])


def parse_payload(cdr: bytes) -> tuple[int, int]:
    """(seq, send time ns) of a bench message."""
    return _STAMP.unpack_from(cdr, _HEAD.size)


def percentile(sorted_vals: list, q: float) -> float:
    if not sorted_vals:
        return math.nan
    k = (len(sorted_vals) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


def run_bench(client, *, count: int = 1000, size: int = 64, rate: float = 1000.0,
              qos: str = "reliable", loopback: bool = False, topic: str | None = None,
              pong_topic: str | None = None, timeout: float = 5.0,
              warmup_timeout: float = 15.0, out=print) -> dict:
    """Run the benchmark on a started Client; returns the result dict."""
    size = max(size, MIN_SIZE)
    if loopback:
        topic = topic or LOOP_TOPIC
        pong_topic = topic
    else:
        topic = topic or PING_TOPIC
        pong_topic = pong_topic or PONG_TOPIC
    lock = threading.Lock()
    lat_ns: list[int] = []
    seen: set[int] = set()
    stats = {"dups": 0, "reordered": 0, "last": -1, "last_rx": 0, "rx_bytes": 0}
    got_probe = threading.Event()

    def on_msg(data: bytes):
        now = time.perf_counter_ns()
        try:
            seq, t0 = parse_payload(data)
        except struct.error:
            return
        if seq & PROBE:
            got_probe.set()
            return
        with lock:
            if seq in seen:
                stats["dups"] += 1
                return
            seen.add(seq)
            if seq < stats["last"]:
                stats["reordered"] += 1
            stats["last"] = max(stats["last"], seq)
            lat_ns.append(now - t0)
            stats["last_rx"] = now
            stats["rx_bytes"] += len(data)

    pub = client.advertise(topic, BENCH_TYPE, qos)
    # A deep reader queue: with KEEP_LAST(10) a reliable burst overwrites samples in the
    # companion's DDS reader before they are taken, and nothing counts that as a drop.
    rel = "best_effort" if "best_effort" in str(qos) else "reliable"
    pong_qos = {"reliability": rel, "durability": "volatile", "depth": 1000}
    client.subscribe(pong_topic, BENCH_TYPE, on_msg, pong_qos, raw=True)
    if not client.wait_connected(warmup_timeout):
        raise RuntimeError("bench: no connection to the bridge")
    # Warm-up: the ROS side creates its entities asynchronously; probe until one comes back.
    out(f"bench: warming up ({topic} -> {pong_topic})")
    deadline = time.monotonic() + warmup_timeout
    probe = 0
    while not got_probe.is_set():
        if time.monotonic() > deadline:
            raise RuntimeError(f"bench: no echo on {pong_topic} within {warmup_timeout:g} s "
                               f"(is a ROS-side echo running? try --loopback)")
        pub.publish(make_payload(PROBE | probe, size), force=True)
        probe += 1
        got_probe.wait(0.1)
    time.sleep(0.1)  # let in-flight probes drain

    out(f"bench: sending {count} x {size} B at "
        f"{'max rate' if not rate else f'{rate:g} Hz'} ({qos})")
    pad = bytes(size - MIN_SIZE)
    period = 1.0 / rate if rate else 0.0
    sent = 0
    full_waits = 0
    t_start = time.perf_counter()
    t_start_ns = time.perf_counter_ns()
    next_t = t_start
    for seq in range(count):
        if period:
            now = time.perf_counter()
            if next_t > now:
                time.sleep(next_t - now)
            next_t += period
        while not pub.publish(make_payload(seq, size, pad=pad), force=True):
            if qos == "best_effort" and not client.connected:
                break
            full_waits += 1          # reliable queue full: back off
            time.sleep(0.001)
        sent += 1
    t_sent = time.perf_counter()
    client.flush(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with lock:
            if len(seen) >= sent:
                break
        time.sleep(0.01)
    with lock:
        lats = sorted(lat_ns)
        received = len(seen)
        rx_span = ((stats["last_rx"] - t_start_ns) / 1e9) if stats["last_rx"] else math.nan
        res = {
            "topic": topic, "pong_topic": pong_topic, "qos": qos, "size": size,
            "rate": rate, "sent": sent, "received": received, "lost": sent - received,
            "duplicates": stats["dups"], "reordered": stats["reordered"],
            "send_duration_s": t_sent - t_start,
            "send_rate_hz": sent / (t_sent - t_start) if t_sent > t_start else math.nan,
            "recv_rate_hz": received / rx_span if received and rx_span > 0 else math.nan,
            "recv_mbit_s": stats["rx_bytes"] * 8 / 1e6 / rx_span if received and rx_span > 0 else math.nan,
            "queue_full_waits": full_waits,
        }
        for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            res[f"rtt_{name}_ms"] = percentile(lats, q) / 1e6
        res["rtt_min_ms"] = lats[0] / 1e6 if lats else math.nan
        res["rtt_max_ms"] = lats[-1] / 1e6 if lats else math.nan
    return res


def format_result(r: dict) -> str:
    return "\n".join([
        (f"sent {r['sent']} x {r['size']} B on {r['topic']} ({r['qos']}), "
         f"received {r['received']} (lost {r['lost']}, duplicates {r['duplicates']}, "
         f"reordered {r['reordered']})"),
        (f"send rate {r['send_rate_hz']:.1f} msg/s; receive rate {r['recv_rate_hz']:.1f} msg/s"
         f" = {r['recv_mbit_s']:.3f} Mbit/s of CDR"),
        (f"round trip ms: min {r['rtt_min_ms']:.3f}  p50 {r['rtt_p50_ms']:.3f}  "
         f"p90 {r['rtt_p90_ms']:.3f}  p99 {r['rtt_p99_ms']:.3f}  max {r['rtt_max_ms']:.3f}"),
    ])


def to_json(r: dict) -> str:
    return json.dumps({k: (None if isinstance(v, float) and math.isnan(v) else v)
                       for k, v in r.items()})

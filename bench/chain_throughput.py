"""Chain throughput: reliable 1 KiB std_msgs/String PUBLISH frames, as fast as TCP takes them,
from one client process (and from 5 in parallel; chainkit.py ubrb-writer, each building its
frames as it sends, like a UE world) through the real gateway + UDP link + companion (dds
backend), counted at an independent cyclonedds reader with a deep reliable queue: delivered/s,
lost, duplicates, order. In the same run, for comparison:

- a bare cyclonedds-python writer (its own process) -> the same kind of reader: what DDS alone
  does on this machine;
- a ``socat`` TCP byte relay carrying the very same UBRB bytes to a counting sink: what moving
  the bytes between two sockets costs.

Issue 12's goal: 0 lost, sustained >= 0.5x the bare DDS path. Both paths are measured the same
way: the same tagged 1 KiB Strings, reliable, counted at the same kind of reader in this process;
the figure is the steady rate (chainkit.steady_rate: between the arrivals of the 10 % and the 90 %
message), with the whole run's rate (first write to last arrival) beside it.

    .venv/bin/python bench/chain_throughput.py [--count 20000] [--clients 5] [--per-client 4000]
        [--link-mtu 1400,8192]
    .venv/bin/python bench/chain_throughput.py --mib [--count 200]

``--mib``: 1 MiB messages (a camera's or a point cloud's size) from one client, figures in MB/s:
the largest rate the chain sustains with the client sending as fast as TCP takes them, beside
the bare DDS writer -> reader's. The bare writer then keeps the whole run in its history
(KEEP_LAST(count)) so that nothing is overwritten: its figure is what the reader sustains,
lossless (with the companion's depth 10 a writer faster than its reader replaces samples); the
chain's companion writer keeps the topic's depth 10, fed at the link's pace.

Needs socat (Debian: apt-get install socat; CI needs the same); without it that row is skipped
and says so. Bounded: every phase has a deadline (--timeout).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "ports", "cpython"))  # ubrb_host
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import chainkit as K  # noqa: E402
from ubrb_host import cli as host_cli  # noqa: E402


def run_chain(chain: K.Chain, topic: str, clients: int, per_client: int, size: int,
              timeout: float) -> Dict[str, Any]:
    """``clients`` client processes (chainkit.py ubrb-writer, each a UE world's stand-in) each
    fire ``per_client`` tagged reliable frames at once. Processes, as the bare DDS writer is one:
    frames built in this process would take the interpreter from the DDS reader that measures."""
    reader = K.dds_reader(topic)
    ws = [K.Proc([sys.executable, os.path.join(K.ROOT, "bench", "chainkit.py"), "ubrb-writer",
                  "--port", str(chain.port), "--topic", topic, "--count", str(per_client),
                  "--client", str(ci), "--size", str(size)]) for ci in range(clients)]
    try:
        for w in ws:
            w.wait_line(r"^ready", 20.0)
        if not K.wait_for(lambda: K.matched(reader) >= 1, 20.0):
            raise RuntimeError("the companion's writer never matched the reader")
        time.sleep(0.3)
        col = K.Collector(reader)
        rss0 = K.rss_kib(chain.gw.pid) if chain.gw else 0
        rss_max = [rss0]
        procs = {k: p for k, p in (("gateway", chain.gw), ("companion", chain.comp)) if p}
        cpu0 = {k: K.cpu_s(p.pid) for k, p in procs.items()}
        cpu0_clients = [K.cpu_s(w.pid) for w in ws]
        t0 = time.monotonic()
        for w in ws:
            os.kill(w.pid, signal.SIGUSR1)
        total = clients * per_client
        end = t0 + timeout
        last_n, last_t = 0, time.monotonic()
        while time.monotonic() < end:
            time.sleep(0.05)
            if chain.gw:
                rss_max[0] = max(rss_max[0], K.rss_kib(chain.gw.pid))
            n = col.count()
            if n >= total:
                break
            if n != last_n:
                last_n, last_t = n, time.monotonic()
            elif time.monotonic() - last_t > 3.0 and all("sent " in w.output() for w in ws):
                break                      # nothing more is coming
        got = col.stop()
        r: Dict[str, Any] = K.check_order([d for _, d in got], clients, per_client)
        r["cpu"] = {k: tuple(b - a for a, b in zip(cpu0[k], K.cpu_s(procs[k].pid))) for k in cpu0}
        used = [tuple(b - a for a, b in zip(c0, K.cpu_s(w.pid))) for c0, w in zip(cpu0_clients, ws)]
        r["cpu"]["clients"] = (sum(u[0] for u in used), sum(u[1] for u in used))
        if got:
            span = got[-1][0] - t0
            r["span_s"] = span
            r["whole_per_s"] = r["delivered"] / span if span > 0 else 0.0
        else:
            r["span_s"] = r["whole_per_s"] = 0.0
        r["per_s"] = K.steady_rate([t for t, _ in got])
        codes: List[str] = []
        for w in ws:
            w.proc.send_signal(signal.SIGTERM)
            codes += w.wait_line(r"^errors:(.*)$", 10.0).group(1).split()
        r["errors"] = sorted(set(codes))
        r["error_frames"] = len(codes)
        r["rss_growth_kib"] = rss_max[0] - rss0
        return r
    finally:
        for w in ws:
            w.stop()
        reader.__del__()


def run_bare_dds(topic: str, count: int, size: int, timeout: float,
                 depth: int = 0) -> Dict[str, Any]:
    reader = K.dds_reader(topic)
    w = K.Proc([sys.executable, os.path.join(K.ROOT, "bench", "chainkit.py"), "dds-writer",
                "--topic", topic, "--count", str(count), "--size", str(size)]
               + (["--depth", str(depth)] if depth else []))
    try:
        K.wait_for(lambda: K.matched(reader) >= 1, 20.0)
        cpu0 = K.cpu_s(w.pid)
        col = K.Collector(reader)
        w.wait_line(r"^writing", 20.0)
        w_t0 = time.monotonic()                # as the chain's: from the first write on
        end = time.monotonic() + timeout + 20
        while time.monotonic() < end and col.count() < count:
            time.sleep(0.02)
        got = col.stop()
        r = K.check_order([d for _, d in got], 1, count)
        r["cpu"] = {"writer": tuple(b - a for a, b in zip(cpu0, K.cpu_s(w.pid)))}
        span = (got[-1][0] - w_t0) if got else 0.0
        r["whole_per_s"] = r["delivered"] / span if span > 0 else 0.0
        r["per_s"] = K.steady_rate([t for t, _ in got])
        return r
    finally:
        w.stop()
        reader.__del__()


def run_socat(count: int, size: int, timeout: float) -> Dict[str, Any]:
    """The same UBRB PUBLISH bytes through ``socat`` TCP->TCP to a counting sink."""
    if shutil.which("socat") is None:
        return {"skipped": "socat not installed (apt-get install socat)"}
    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))
    sink.listen(1)
    relay_port = K.free_port()
    p = subprocess.Popen(["socat", "TCP-LISTEN:%d,bind=127.0.0.1,reuseaddr" % relay_port,
                          "TCP:127.0.0.1:%d" % sink.getsockname()[1]],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        src = None
        end = time.monotonic() + 5
        while src is None and time.monotonic() < end:
            try:
                src = socket.create_connection(("127.0.0.1", relay_port), timeout=1)
            except OSError:
                time.sleep(0.05)
        if src is None:
            return {"skipped": "socat did not listen"}
        conn, _ = sink.accept()
        frame_len = 16 + size
        total = count * frame_len
        got = [0, 0.0]

        def drain() -> None:
            conn.settimeout(timeout)
            while got[0] < total:
                b = conn.recv(1 << 20)
                if not b:
                    break
                got[0] += len(b)
            got[1] = time.monotonic()
        th = threading.Thread(target=drain)
        th.start()
        from ubrb_client import frames as F
        t0 = time.monotonic()
        for i in range(0, count, 64):
            src.sendall(b"".join(F.encode_data_frame(F.PUBLISH, 1, K.tagged_cdr(0, k, size))
                                 for k in range(i, min(count, i + 64))))
        th.join(timeout)
        src.close()
        conn.close()
        span = got[1] - t0
        return {"delivered": got[0] // frame_len, "per_s": (got[0] / frame_len) / span
                if span > 0 else 0.0}
    finally:
        p.terminate()
        p.wait(5)
        sink.close()


def fmt(r: Dict[str, Any], size: int = 0) -> str:
    if "skipped" in r:
        return "skipped: " + r["skipped"]
    s = "%9.0f msg/s  delivered %d" % (r.get("per_s", 0.0), r.get("delivered", 0))
    if size:
        s = "%7.1f MB/s (%.1f msg/s)  delivered %d" % (r.get("per_s", 0.0) * size / 1e6,
                                                       r.get("per_s", 0.0), r.get("delivered", 0))
    if "whole_per_s" in r:
        s += " (whole run %.0f/s)" % r["whole_per_s"]
    for k in ("lost", "duplicates", "out_of_order"):
        if k in r:
            s += "  %s %d" % (k, r[k])
    if "rss_growth_kib" in r:
        s += "  gateway RSS +%d KiB" % r["rss_growth_kib"]
    for k, (used, waited) in sorted(r.get("cpu", {}).items()):
        s += "\n      %s: %.1f us CPU per message, %.2f s waiting for a CPU" % (
            k, 1e6 * used / max(1, r.get("delivered", 0)), waited)
    if r.get("errors"):
        s += "  ERROR frames %d %s" % (r["error_frames"], ",".join(r["errors"]))
    return s


def main(argv: List[str] | None = None) -> int:
    ap = host_cli.script_parser("bench/chain_throughput.py", __doc__ or "")
    ap.add_argument("--count", type=host_cli.positive_int, default=20000,
                    help="messages from one client")
    ap.add_argument("--clients", type=int, default=5, help="parallel clients (0: skip)")
    ap.add_argument("--per-client", type=int, default=4000, help="messages per parallel client")
    ap.add_argument("--size", type=int, default=1024, help="CDR bytes per message (1024)")
    ap.add_argument("--timeout", type=host_cli.duration, default=60.0,
                    help="deadline of each phase, s")
    ap.add_argument("--mib", action="store_true",
                    help="1 MiB messages from one client, in MB/s (--count 200 unless given)")
    ap.add_argument("--link-mtu", default=str(1400),
                    help="comma-separated --link-mtu values, each a chain of its own on both "
                         "ends, in this run (e.g. 1400,8192)")
    a = ap.parse_args(argv)
    mtus = [int(m) for m in a.link_mtu.split(",") if m.strip()]
    mb = 0                                # bytes a message when figures are in MB/s
    if a.mib:
        a.size, a.clients, mb = 1 << 20, 0, 1 << 20
        if "--count" not in (argv if argv is not None else sys.argv):
            a.count = 200

    print("chain throughput, reliable %d B std_msgs/String, DDS domain %d (loopback only); "
          "load %.2f" % (a.size, K.DOMAIN, os.getloadavg()[0]))
    bare = run_bare_dds("/bench/bare", a.count, a.size, a.timeout, a.count if mb else 0)
    print("  bare cyclonedds writer -> reader    %s" % fmt(bare, mb))
    if not mb:
        relay = run_socat(a.count, a.size, a.timeout)
        print("  socat TCP byte relay (same bytes)   %s" % fmt(relay))
    one: Dict[str, Any] = {}
    for mi, mtu in enumerate(mtus):
        flags = ("--link-mtu", str(mtu))
        print("  link MTU %d (--link-mtu on both ends)" % mtu)
        chain = K.Chain(gateway_args=flags, companion_args=flags)
        try:
            r = run_chain(chain, "/bench/one%d" % mtu, 1, a.count, a.size, a.timeout)
            print("  chain, 1 client x %-6d            %s" % (a.count, fmt(r, mb)))
            if mi == 0:
                one = r                   # the first MTU's figure is compared with bare DDS
            if a.clients:
                many = run_chain(chain, "/bench/many%d" % mtu, a.clients, a.per_client, a.size,
                                 a.timeout)
                print("  chain, %d clients x %-6d          %s" % (a.clients, a.per_client,
                                                               fmt(many)))
        finally:
            out = chain.close()
        lc = K.last_counters(out)
        if lc:
            print("  gateway link counters: " + ", ".join(
                "%s=%s" % (k, lc[k]) for k in ("tx_frames", "retx", "timeouts", "fast_retx",
                                              "drop_rel_full", "drop_be") if k in lc))
    if bare.get("per_s") and mb:
        print("  1 MiB messages: chain %.1f MB/s, bare DDS %.1f MB/s (steady rates): %.2f of bare "
              "DDS; lost %d" % (one.get("per_s", 0) * mb / 1e6, bare["per_s"] * mb / 1e6,
                                one.get("per_s", 0) / bare["per_s"], one.get("lost", -1)))
    elif bare.get("per_s"):
        ratio = one.get("per_s", 0) / bare["per_s"]
        met = ratio >= 0.5 and one.get("lost", 1) == 0
        print("  chain/bare = %.2f (steady rates), lost %d (goal: >= 0.5 and 0 lost: %s)"
              % (ratio, one.get("lost", -1), "met" if met else "NOT met"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

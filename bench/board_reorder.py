"""A board's receive direction on a link that reorders (issue 20), through the real processes:
a DDS writer (an independent cyclonedds participant, a ROS node's stand-in) -> the companion
(``python -m ros_side --backend dds``) -> UDP through tools/impair.UdpImpairProxy -> the deployed
MicroPython gateway (``tools/deploy.py build``: the .mpy files of stock firmware, the unix port,
``-X heapsize=``) -> a UBRB client subscribed to the topic (a UE world's stand-in).

The board keeps frames that arrive past a gap (selective repeat: the companion resends only what
is missing) when its heap has room for them beside its worst-case budget and 32 KiB free
(ports/micropython/build.build); without that room it keeps none, and the companion goes
back over every frame after the gap. The same stream is run at two heaps, one on each side of that
line, and on the clean link for comparison:

    condition   the proxy, both directions
    clean       nothing
    reorder     5 % of the datagrams held back behind 1..8 later ones (bench/link_field.py's)
    mixed       5 % drop + 5 % duplication + 5 % reordered within 8 + 0-20 ms delay

Per run: whether the gateway kept frames (its start-up line), delivered (distinct messages at the
client, in order or not), msg/s (steady: between the 10 % and 90 % arrival), p50/p99 latency
(written -> received), and the link counters of both ends: the companion's retransmissions
(retx, fast_retx, timeouts) and the gateway's out-of-order frames (ooo), duplicates (dup) and
reliable MESSAGEs its clients' full queues refused (dropped_queue: a gap the client sees).

    .venv/bin/python bench/board_reorder.py [--heaps 170k,320k] [--rate 300] [--seconds 10]
        [--micropython PATH] [CONDITION ...]

The heaps are the unix port's (PyPI, 64-bit) unless --micropython names another build (a 32-bit
one: its heap figures are smaller; ports/micropython/README.md, "Memory").
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "ports", "cpython"))  # ubrb_host
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import chainkit as K  # noqa: E402
from tools import deploy  # noqa: E402
from tools.impair import UdpImpairProxy  # noqa: E402
from ubrb_client import frames as F  # noqa: E402
from ubrb_host import cli as host_cli  # noqa: E402

TOPIC = "/board_rx"
SIZE = 1024
QOS = {"reliability": "reliable", "durability": "volatile", "depth": 1000}
CONDITIONS: Dict[str, Dict[str, Any]] = {
    "clean": {},
    "reorder": dict(reorder=0.05, depth=8),
    "mixed": dict(loss=0.05, dup=0.05, reorder=0.05, depth=8, delay=(0.0, 0.020)),
}
COMPANION_COUNTERS = ("tx_frames", "retx", "fast_retx", "timeouts")
GATEWAY_COUNTERS = ("rx_frames", "ooo", "dup", "dropped_queue")


def gateway_counters(output: str) -> Dict[str, int]:
    """The counters the MicroPython gateway logs when stopped (dicts' reprs): the link's, and
    the gateway's dropped_queue (reliable MESSAGEs a client's full queue refused)."""
    found: Dict[str, int] = {}
    m = re.search(r"link counters: (\{.*\})", output)
    if m:
        found = {k: int(v) for k, v in ast.literal_eval(m.group(1)).items()}
    m = re.search(r"stopped; counters: (\{.*\})", output)
    if m:
        found["dropped_queue"] = int(ast.literal_eval(m.group(1))["dropped_queue"])
    return found


def keep_alive(client: K.RawClient, done: threading.Event) -> None:
    """A PING every 2 s, as a UE world sends: a client that only listens is otherwise closed after
    10 s with nothing received (docs/PROTOCOL.md)."""
    while not done.wait(2.0):
        try:
            client.send(F.encode_frame(F.PING))
        except OSError:
            return


def percentile(values: List[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def run(layout: str, exe: str, heap: str, impair: Dict[str, Any], rate: float, seconds: float,
        drain: float) -> Dict[str, Any]:
    lport = K.free_port(socket.SOCK_DGRAM)
    comp = K.Proc([sys.executable, "-m", "ros_side", "--backend", "dds", "--domain",
                   str(K.DOMAIN), "--link", "udp://127.0.0.1:%d" % lport])
    proxy = UdpImpairProxy(("127.0.0.1", lport), seed=1, **impair)
    gw: Optional[K.Proc] = None
    client: Optional[K.RawClient] = None
    pinging = threading.Event()
    try:
        comp.wait_line(r"companion on link")
        port = K.free_port()
        gw = K.Proc([exe, "-X", "heapsize=" + heap, "main.py", "--listen", "127.0.0.1:%d" % port,
                     "--link", "udp://127.0.0.1:%d" % proxy.port], cwd=layout)
        kept = gw.wait_line(r"link: keeps (no )?frames past a gap", 20).group(1) is None
        gw.wait_line(r"ROS side up", 20)
        client = K.RawClient(port, "board_rx")
        client.subscribe(1, TOPIC, QOS)
        threading.Thread(target=keep_alive, args=(client, pinging), daemon=True).start()
        writer = K.dds_writer(TOPIC)
        K.wait_for(lambda: K.matched(writer) > 0, 20)
        time.sleep(0.5)  # the companion's reader matched the writer too (both sides know)
        total = int(rate * seconds)
        sent_at: List[float] = []
        t0 = time.monotonic()
        for i in range(total):
            due = t0 + i / rate
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            sent_at.append(time.monotonic())
            K.write_raw(writer, K.tagged_cdr(0, i, SIZE))
        K.wait_for(lambda: len(client.messages.get(1, [])) >= total, drain)
        got = list(client.messages.get(1, []))
        seqs = [K.tag_of(d)[1] for _, d in got]
        lat = [t - sent_at[s] for (t, _), s in zip(got, seqs) if 0 <= s < total]
        times = [t for t, _ in got]
        missing = sorted(set(range(total)) - set(seqs))
        return {"kept": kept, "offered": total, "delivered": len(set(seqs)),
                "missing": missing[:3] + (["..."] if len(missing) > 6 else []) + missing[-3:]
                if len(missing) > 6 else missing,
                "in_order": seqs == sorted(seqs), "msg_s": K.steady_rate(times) if times else 0.0,
                "p50": percentile(lat, 0.5), "p99": percentile(lat, 0.99)}
    finally:
        if client is not None:
            pinging.set()
            client.close()
        gw_out = ""
        if gw is not None:
            if gw.proc.poll() is None:
                gw.proc.send_signal(signal.SIGINT)  # the unix port logs its counters on Ctrl-C
                try:
                    gw.proc.wait(5)
                except subprocess.TimeoutExpired:
                    gw.proc.kill()
            gw.t.join(5)
            gw_out = gw.output()
        comp.stop()
        proxy.close()
        run.counters = (K.last_counters(comp.output()), gateway_counters(gw_out))  # type: ignore
        run.outputs = (comp.output(), gw_out)  # type: ignore


def main(argv: Optional[List[str]] = None) -> int:
    ap = host_cli.script_parser("bench/board_reorder.py", __doc__ or "")
    ap.add_argument("conditions", nargs="*", metavar="CONDITION",
                    help="of %s (default: all)" % ", ".join(CONDITIONS))
    ap.add_argument("--heaps", default="170k,320k",
                    help="the gateway's heaps, comma-separated (default 170k,320k: the 64-bit "
                         "unix port keeps no frames in the first, a window in the second)")
    ap.add_argument("--rate", type=float, default=300.0, help="messages per second (300)")
    ap.add_argument("--seconds", type=host_cli.duration, default=10.0)
    ap.add_argument("--drain", type=host_cli.duration, default=20.0,
                    help="seconds to wait for the last messages (20)")
    ap.add_argument("--micropython", default=None,
                    help="the unix port to run (default: the venv's, from PyPI)")
    args = ap.parse_args(argv)
    for c in args.conditions:
        if c not in CONDITIONS:
            ap.error("unknown condition %r (one of %s)" % (c, ", ".join(CONDITIONS)))
    exe = args.micropython or os.path.join(os.path.dirname(sys.executable), "micropython")
    if not os.path.isfile(exe):
        ap.error("no MicroPython unix port at %s (make venv installs it)" % exe)
    layout = tempfile.mkdtemp(prefix="ubrb-board-reorder-")
    try:
        deploy.build(layout, {"link": "none"})
        print("%-8s %6s %5s %9s %8s %7s %7s %7s  %s" % (
            "cond", "heap", "kept", "delivered", "msg/s", "p50 ms", "p99 ms", "order",
            "companion %s | gateway %s" % ("/".join(COMPANION_COUNTERS),
                                          "/".join(GATEWAY_COUNTERS))))
        for cond in args.conditions or list(CONDITIONS):
            for heap in args.heaps.split(","):
                r = run(layout, exe, heap, CONDITIONS[cond], args.rate, args.seconds, args.drain)
                comp_c, gw_c = run.counters  # type: ignore
                print("%-8s %6s %5s %4d/%-4d %8.0f %7.1f %7.1f %7s  %s | %s" % (
                    cond, heap, "yes" if r["kept"] else "no", r["delivered"], r["offered"],
                    r["msg_s"], 1000 * r["p50"], 1000 * r["p99"],
                    "yes" if r["in_order"] else "NO",
                    "/".join(str(comp_c.get(k, 0)) for k in COMPANION_COUNTERS),
                    "/".join(str(gw_c.get(k, 0)) for k in GATEWAY_COUNTERS)), flush=True)
                if r["missing"]:
                    print("         missing: %s" % " ".join(map(str, r["missing"])))
    finally:
        shutil.rmtree(layout, True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

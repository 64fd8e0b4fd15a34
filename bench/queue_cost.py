"""Cost of one event for a client whose send queue is full, against the size of that queue.

Issue 13: a client that stops reading (a UE editor paused in a breakpoint) used to make every
event scan its whole queue. This prints, for queue sizes from 256 KiB to 16 MiB, the worst and
the median time of one event of each kind (the worst: of the quietest of three runs), for the core as it is and, in the same run, for the
core before issue 13 (`git show REV:ubrb_min.py`, default fa61a51):

  message/be   a 1 KiB ROS message fanned out to a stalled best_effort subscriber
  message/rel  the same for a reliable subscriber
  ping         a PING from a client that does not read its PONGs
  publish/unk  a PUBLISH for an id never advertised, from a client that does not read its ERRORs

Usage: .venv/bin/python bench/queue_cost.py [--events N] [--before REV]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types
from typing import Any, Callable, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "ports", "cpython"))  # ubrb_host
sys.path.insert(0, ROOT)

import ubrb_min  # noqa: E402
from ubrb_host import cli as host_cli  # noqa: E402

SIZES = (256 * 1024, 2 * 1024 * 1024, 16 * 1024 * 1024)
KINDS = ("message/be", "message/rel", "ping", "publish/unk")
MSG = 1024


def load_before(rev: str) -> Any:
    src = subprocess.run(["git", "show", rev + ":ubrb_min.py"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    mod = types.ModuleType("ubrb_min_before")
    mod.__file__ = os.path.join(ROOT, "ubrb_min.py")
    exec(compile(src, "ubrb_min.py@" + rev, "exec"), mod.__dict__)
    return mod


def frame(U: Any, op: int, obj: Dict[str, Any]) -> bytes:
    return bytes(U.encode_json_frame(op, obj))


def stalled_gateway(U: Any, queue_bytes: int, kind: str) -> Callable[[int], None]:
    """A gateway with one client that never reads, its queue already full; returns event(i)."""
    prof = U.make_profile("pi", {"max_clients": 2, "max_payload": 16 * 1024, "max_control": 512,
                                 "queue_bytes": queue_bytes, "control_reserve": 16 * 1024})
    gw = U.Gateway(prof)
    gw.ros_up("humble", 16 * 1024)
    ci = gw.accept(0)
    dec = gw.clients[ci].decoder

    def feed(data: bytes, now: int = 0) -> None:
        U.copy_into(dec.buf, dec.fill, data, 0, len(data))
        gw.received(ci, len(data), now)
        while getattr(gw, "backlog", None) and gw.backlog(ci):
            gw.received(ci, 0, now)

    rel = "best_effort" if kind == "message/be" else "reliable"
    feed(frame(U, U.OP_HELLO, {"protocol": 1, "client": "stalled"})
         + frame(U, U.OP_SUBSCRIBE, {"id": 1, "topic": "/t", "type": "std_msgs/msg/String",
                                     "qos": {"reliability": rel}}))
    slot = gw.subs.find("/t")
    msg = bytearray(MSG)
    ping = bytes(U.encode_frame(U.OP_PING, b""))
    # Fill it: messages up to the data room, PINGs up to the control room, then some more.
    for _ in range(queue_bytes // (MSG + 16) + 10):
        gw.ros_message(slot, msg, 0, MSG)
    for _ in range(16 * 1024 // 12 + 10):
        feed(ping)

    if kind.startswith("message"):
        return lambda i: gw.ros_message(slot, msg, 0, MSG)
    if kind == "ping":
        return lambda i: feed(ping)
    unknown = [bytes(U.encode_frame(U.OP_PUBLISH, (7 + k).to_bytes(4, "little") + bytes(8)))
               for k in range(64)]
    return lambda i: feed(unknown[i % 64], 2000 * i)  # a new second: the ERROR is due again


def measure(event: Callable[[int], None], n: int) -> List[float]:
    ts = []
    for i in range(n):
        t0 = time.perf_counter_ns()
        event(i)
        ts.append((time.perf_counter_ns() - t0) / 1000.0)
    return sorted(ts)


def main() -> int:
    ap = host_cli.script_parser("bench/queue_cost.py", __doc__ or "")
    ap.add_argument("--events", type=host_cli.positive_int, default=300,
                    help="events timed per case (default 300)")
    ap.add_argument("--before", default="fa61a51", help="git revision of the earlier core")
    args = ap.parse_args()
    cores = [("before", load_before(args.before)), ("after", ubrb_min)]
    print("cost of one event for a client whose queue is full, in microseconds: the worst of %d "
          "events (quietest of 3 runs) / the median" % args.events)
    print("%-12s %-10s" % ("event", "queue") + "".join("%24s" % name for name, _ in cores))
    for kind in KINDS:
        for size in SIZES:
            cells = []
            for _, U in cores:
                # The worst event of the quietest of three runs: a shared machine preempts a
                # process now and then, which is not the cost of the event.
                runs = [measure(stalled_gateway(U, size, kind), args.events) for _ in range(3)]
                worst = min(ts[-1] for ts in runs)
                median = sorted(ts[len(ts) // 2] for ts in runs)[1]
                cells.append("%11.1f / %9.1f" % (worst, median))
            print("%-12s %-10s" % (kind, "%d KiB" % (size // 1024)) + "".join("%24s" % c
                                                                             for c in cells))
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Registration churn (issue 20, item 5): one UBRB client SUBSCRIBEs and UNSUBSCRIBEs (or
ADVERTISEs and UNADVERTISEs) valid topics as fast as TCP takes the frames, for ``--seconds``;
meanwhile a second client ADVERTISEs a topic (and releases it) every second and times the answer
(its first SUB_COUNT, or an ERROR). Through the real programs: ``python ubrb_min.py`` + a UDP link +
``python -m ros_side`` (``--backend dds``, or ``rclpy`` under .venv-ros).

Printed, beside each other: the second client's registration delay without churn and under it
(the target: within 1 s), the companion's loop lag (its ``loop.*`` counters, from a SIGUSR1; the
target: at most 100 ms), the link going down (the companion's ``link.down``), the companion's RSS
from the first 10 s of churn to the end (the target: flat; before the fix +80 B per pair), and
the pairs the churner got through.

    python bench/registration_churn.py --seconds 60 [--kind sub|pub] [--topics N]
        [--backend dds|rclpy]
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import threading
import time
from typing import Any, Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "ports", "cpython"))

from bench import chainkit as K  # noqa: E402
from ubrb_client import frames as F  # noqa: E402

ROS_PYTHON = os.path.join(ROOT, ".venv-ros", "bin", "python")
FASTDDS_XML = os.path.join(ROOT, "tests", "ros", "fastdds_loopback.xml")


class Client(K.RawClient):
    """chainkit's client, plus the arrival time of each publisher id's first SUB_COUNT and a
    PING every 2 s (the gateway drops a client silent for 10 s)."""

    def __init__(self, port: int, name: str) -> None:
        self.first_count: Dict[int, float] = {}
        self.answered = threading.Condition()
        super().__init__(port, name)
        threading.Thread(target=self._pinger, daemon=True).start()

    def _pinger(self) -> None:
        while not self.closed:
            time.sleep(2.0)
            try:
                self.send(F.encode_frame(F.PING))
            except OSError:
                return

    def on_frame(self, op: int, payload: Any, now: float) -> None:
        if op in (F.SUB_COUNT, F.ERROR):       # (an ERROR is in self.errors already)
            d = json.loads(bytes(payload))
            ids = [d.get("id")] if op == F.ERROR else [int(k) for k in d["counts"]]
            with self.answered:
                for i in ids:
                    if isinstance(i, int):
                        self.first_count.setdefault(i, now)
                self.answered.notify_all()

    def register(self, id_: int, topic: str, timeout: float = 60.0) -> Tuple[float, Any]:
        """ADVERTISE ``topic`` as ``id_``: (seconds until it was answered, inf if not in time;
        the ERROR code it got, None if none)."""
        t0 = time.monotonic()
        self.advertise(id_, topic, K.QOS_R)
        with self.answered:
            self.answered.wait_for(lambda: id_ in self.first_count, timeout)
        code = next((e.get("code") for e in self.errors if e.get("id") == id_), None)
        return self.first_count.get(id_, float("inf")) - t0, code


class Churner(threading.Thread):
    def __init__(self, port: int, kind: str, topics: int) -> None:
        super().__init__(daemon=True)
        self.c = Client(port, "churner")
        self.kind, self.topics = kind, topics
        self.pairs = 0
        self.stop = threading.Event()

    def run(self) -> None:
        reg, unreg = ((F.SUBSCRIBE, F.UNSUBSCRIBE) if self.kind == "sub"
                      else (F.ADVERTISE, F.UNADVERTISE))
        k = 0
        try:
            while not self.stop.is_set():
                batch = []
                for _ in range(32):
                    k += 1
                    batch.append(F.encode_json_frame(reg, {
                        "id": k, "topic": "/churn_%d" % (k % self.topics),
                        "type": K.STRING_TYPE, "qos": K.QOS_R}))
                    batch.append(F.encode_json_frame(unreg, {"id": k}))
                self.c.send(b"".join(batch))
                self.pairs = k
        except OSError:
            pass


def companion_counters(chain: K.Chain) -> Dict[str, Dict[str, Any]]:
    """The companion's counters table, now (SIGUSR1), as {group: {name: value}}."""
    assert chain.comp is not None
    mark = len(chain.comp.output())
    os.kill(chain.comp.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        out = chain.comp.output()[mark:]
        if "loop.cpu_peak_ms" in out or out.count("\n") > 40:
            break
        time.sleep(0.05)
    out = chain.comp.output()[mark:]
    return {g: K.last_counters(out, g) for g in ("link", "loop")}


def fmt_delays(got: List[Tuple[float, Any]]) -> str:
    """Registrations made (their SUB_COUNT came) and refused (an ERROR came: its code)."""
    made = [t for t, code in got if code is None]
    refused = [code for _, code in got if code is not None]
    late = sum(1 for t in made if t == float("inf"))
    out = "%d of %d made" % (len(made) - late, len(got))
    if late:
        out += ", %d not answered in time" % late
    if made:
        out += ", median %s, worst %s" % tuple(
            "%.3f s" % t if t != float("inf") else "not answered"
            for t in (statistics.median(made), max(made)))
    if refused:
        out += "; refused: %s" % ", ".join(sorted(set(refused)))
    return out


def run(seconds: float, kind: str, topics: int, backend: str) -> Tuple[str, ...]:
    if backend == "rclpy":
        os.environ["FASTDDS_DEFAULT_PROFILES_FILE"] = FASTDDS_XML

    class Chain(K.Chain):
        def start_companion(self) -> None:
            if backend == "rclpy":
                self.comp_argv[0] = ROS_PYTHON
                self.comp_argv[self.comp_argv.index("--backend") + 1] = "rclpy"
            super().start_companion()

    chain = Chain()
    try:
        assert chain.comp is not None
        victim = Client(chain.port, "victim")
        quiet = []
        # 1 s apart, as below: the release's SUB_COUNT goes out 0.5 s after the answer (the
        # gateway's pace), and the next answer must not wait for the one after it
        for i in range(1, 6):
            quiet.append(victim.register(i, "/victim_quiet_%d" % i))
            victim.send(F.encode_json_frame(F.UNADVERTISE, {"id": i}))
            time.sleep(1.0)
        churn = Churner(chain.port, kind, topics)
        churn.start()
        t0 = time.monotonic()
        cpu0 = K.cpu_s(chain.comp.pid)
        busy: List[Tuple[float, Any]] = []
        rss: List[Tuple[float, int, int]] = []      # (t, rss KiB, pairs)
        i = 100
        while time.monotonic() - t0 < seconds:
            i += 1
            # eight names in turn, each released again: its writer is made anew every time
            # (gone after its 250 ms linger), and what the companion holds for this client
            # stays the same, so its RSS shows the churn's cost alone
            busy.append(victim.register(i, "/victim_%d" % (i % 8), timeout=max(5.0, seconds)))
            victim.send(F.encode_json_frame(F.UNADVERTISE, {"id": i}))
            rss.append((time.monotonic() - t0, K.rss_kib(chain.comp.pid), churn.pairs))
            time.sleep(1.0)
        cpu1 = K.cpu_s(chain.comp.pid)
        counters = companion_counters(chain)
        churn.stop.set()
        churn.join(5)
        refused = len(churn.c.errors)
    finally:
        chain.close()
    warm = next((r for r in rss if r[0] >= min(10.0, seconds / 3)), rss[0])
    last = rss[-1]
    pairs = last[2] - warm[2]
    loop = counters["loop"]
    lines = (
        "registration churn, %s backend: one client %s/%s on %d topic%s for %.0f s, %d pairs "
        "(%.0f/s), %d refused" % (
            backend, "SUBSCRIBE" if kind == "sub" else "ADVERTISE",
            "UNSUBSCRIBE" if kind == "sub" else "UNADVERTISE", topics, "s" if topics > 1 else "",
            seconds, churn.pairs, churn.pairs / seconds, refused),
        "  another client's registration, no churn: %s" % fmt_delays(quiet),
        "  another client's registration, churn:    %s (target: within 1 s)" % fmt_delays(busy),
        "  companion loop lag: peak %s ms, worst of the last second %s ms, iterations over "
        "100 ms %s, most CPU in one iteration %s ms (target: at most 100 ms)" % (
            loop.get("lag_peak_ms", "?"), loop.get("lag_max_ms", "?"),
            loop.get("stalls_100ms", 0), loop.get("cpu_peak_ms", "?")),
        "  companion CPU during the churn: %.1f s used, %.1f s runnable but waiting for a CPU "
        "(a shared machine: a lag far above the CPU of one iteration is that wait)" % (
            cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]),
        "  link down during the run: %d" % counters["link"].get("down", 0),
        "  companion RSS: %d KiB at %.0f s, %d KiB at %.0f s: %+d KiB over %d pairs, %+.2f B "
        "per pair (before the fix: +80)" % (
            warm[1], warm[0], last[1], last[0], last[1] - warm[1], pairs,
            (last[1] - warm[1]) * 1024.0 / max(1, pairs)),
        "  companion RSS every 10 s of churn (KiB): %s" % ", ".join(
            "%d" % next(r for r in rss if r[0] >= t)[1] for t in range(0, int(last[0]) + 1, 10)),
    )
    return lines


def main() -> int:
    from ubrb_host import cli as host_cli
    p = host_cli.script_parser("bench/registration_churn.py", __doc__ or "")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--kind", choices=("sub", "pub"), default="sub")
    p.add_argument("--topics", type=int, default=1, help="distinct topic names the churner cycles")
    p.add_argument("--backend", choices=("dds", "rclpy"), default="dds")
    a = p.parse_args()
    for line in run(a.seconds, a.kind, a.topics, a.backend):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

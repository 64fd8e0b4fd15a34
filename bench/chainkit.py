"""Process and line plumbing shared by the chain benches (bench/line_efficiency.py,
bench/chain_throughput.py, bench/chain_latency.py) and tests/e2e/test_backpressure.py.

Everything here drives the real programs through their command lines only -- the gateway
(``python ubrb_min.py --listen ... --link ...``), the companion (``python -m ros_side --link ...
--backend dds``) -- and talks to them from outside: UBRB over TCP (frames from
``ubrb_client.frames``), DDS through an independent cyclonedds participant. So it survives any
restructuring of the gateway's modules.

All traffic stays on this machine: TCP and UDP on 127.0.0.1, DDS confined to ``lo`` by the
loopback Cyclone configuration of shared/design/ROS-NOTES.md plus a discovery tag unique to this
process (participants of other runs cannot match ours), set as ``CYCLONEDDS_URI`` before any
participant exists.

A serial link is two pty pairs joined by ``PacedLine`` (tools/ptyline.py): a relay that moves
bytes between the two masters at baud/10 bytes per second in each direction (8N1, like a UART),
counts them and sorts them into link frames.

Also runnable: ``python bench/chainkit.py dds-writer ...`` is the bare cyclonedds-python writer
the throughput bench compares the chain with (a separate process, like the companion), and
``python bench/chainkit.py ubrb-writer ...`` one UBRB client of the chain (a process of its own
too, as a UE world is).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tools.ptyline import PtyLine  # noqa: E402
from ubrb_client import frames as F  # noqa: E402

LOOPBACK_XML = (
    '<CycloneDDS><Domain><General><Interfaces><NetworkInterface name="lo"/></Interfaces>'
    '<AllowMulticast>false</AllowMulticast></General><Discovery>'
    '<ParticipantIndex>auto</ParticipantIndex><MaxAutoParticipantIndex>50</MaxAutoParticipantIndex>'
    '<Peers><Peer address="127.0.0.1"/></Peers></Discovery></Domain></CycloneDDS>'
)
TAG = "ubrb-bench-%d-%s" % (os.getpid(), os.urandom(4).hex())
DDS_XML = os.environ.get("UBRB_BENCH_XML") or LOOPBACK_XML.replace(
    "<Discovery>", "<Discovery><Tag>%s</Tag>" % TAG, 1)
assert '<NetworkInterface name="lo"/>' in DDS_XML
DOMAIN = int(os.environ.get("UBRB_BENCH_DOMAIN", str(200 + os.getpid() % 13)))
os.environ["CYCLONEDDS_URI"] = DDS_XML       # this process: before any participant exists

STRING_TYPE = "std_msgs/msg/String"
STRING_DDS = "std_msgs::msg::dds_::String_"
QOS_R: Dict[str, Any] = {"reliability": "reliable", "durability": "volatile", "depth": 10}
QOS_BE: Dict[str, Any] = {"reliability": "best_effort", "durability": "volatile", "depth": 1}


def child_env() -> Dict[str, str]:
    env = dict(os.environ)
    env["CYCLONEDDS_URI"] = DDS_XML
    env["UBRB_BENCH_XML"] = DDS_XML              # a child chainkit joins this run's tag ...
    env["UBRB_BENCH_DOMAIN"] = str(DOMAIN)       # ... and domain
    env["ROS_DOMAIN_ID"] = str(DOMAIN)
    env.pop("ROS_LOCALHOST_ONLY", None)
    env.pop("ROS_AUTOMATIC_DISCOVERY_RANGE", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


# Where free ports come from: the kernel's ephemeral range, unless a caller hands its own source
# (use_ports). The tests do: another worker's socket can take an ephemeral port between this
# check and the child's bind ("address already in use" for a companion once).
_port_source: Optional[Callable[[int], int]] = None


def use_ports(source: Callable[[int], int]) -> None:
    global _port_source
    _port_source = source


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    if _port_source is not None:
        return _port_source(kind)
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return int(p)


def rss_kib(pid: int) -> int:
    """Resident set size of a process (VmRSS), KiB."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_s(pid: int) -> Tuple[float, float]:
    """(CPU seconds used, seconds spent runnable but waiting for a CPU) by a process so far,
    every thread included (/proc/PID/stat and schedstat). A pipeline on a shared 2-core machine
    is often starved rather than slow: the second figure tells the two apart."""
    with open("/proc/%d/stat" % pid) as g:
        f = g.read().rsplit(")", 1)[1].split()
    used = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    waited = 0
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as g:
                waited += int(g.read().split()[1])
        except (OSError, IndexError, ValueError):
            pass                                   # a thread that just ended
    return used, waited / 1e9


# -- CDR of std_msgs/String (hand-built: no per-message library call) ------------------------------
def string_cdr(text: bytes) -> bytes:
    """CDR (little-endian header) of a std_msgs/String whose data is ``text``."""
    n = len(text) + 1
    return b"\x00\x01\x00\x00" + n.to_bytes(4, "little") + text + b"\x00"


def string_of(cdr: bytes) -> bytes:
    n = int.from_bytes(cdr[4:8], "little")
    return bytes(cdr[8:8 + n - 1])


def tagged_cdr(client: int, seq: int, size: int) -> bytes:
    """A String CDR of exactly ``size`` bytes whose text starts with ``client:seq:``."""
    head = b"%d:%d:" % (client, seq)
    pad = size - 9 - len(head)
    if pad < 0:
        raise ValueError("size too small")
    return string_cdr(head + b"x" * pad)


def tag_of(cdr: bytes) -> Tuple[int, int]:
    c, s, _ = string_of(cdr).split(b":", 2)
    return int(c), int(s)


# -- processes ---------------------------------------------------------------------------------
class Proc:
    """A subprocess whose stdout+stderr is collected line by line in the background."""

    def __init__(self, argv: List[str], env: Optional[Dict[str, str]] = None,
                 cwd: str = ROOT) -> None:
        self.argv = argv
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env or child_env(),
                                     stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     bufsize=1)
        self.lines: List[str] = []
        self.cv = threading.Condition()
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.cv:
                self.lines.append(line)
                self.cv.notify_all()
        with self.cv:
            self.cv.notify_all()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        with self.cv:
            return "".join(self.lines)

    def wait_line(self, pattern: str, timeout: float = 20.0) -> "re.Match[str]":
        rx = re.compile(pattern)
        end = time.monotonic() + timeout
        k = 0
        with self.cv:
            while True:
                while k < len(self.lines):
                    m = rx.search(self.lines[k])
                    if m:
                        return m
                    k += 1
                left = end - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self.t.is_alive()):
                    raise RuntimeError("%r not seen in the output of %s:\n%s"
                                       % (pattern, " ".join(self.argv), "".join(self.lines)))
                self.cv.wait(min(left, 0.1))

    def stop(self) -> Optional[int]:
        """SIGTERM (the programs log their counters on the way out), SIGKILL after 5 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.t.join(5)
        return self.proc.returncode


# -- a serial line: two pty pairs joined by a pacing, counting proxy ------------------------------
LINK_KINDS = {1: "hello", 2: "reliable", 3: "best_effort", 4: "ack", 5: "be_fragment"}


class FrameSniffer:
    """Passive census of link frames in one direction of the line (byte layout of docs/LINK.md:
    sync A5 4E, length u16 LE of the whole frame, ctl whose low nibble is the kind): frames and
    bytes per kind, and the arrival times of frames of ``big`` bytes or more."""

    def __init__(self, big: int = 512) -> None:
        self.buf = bytearray()
        self.frames: Dict[str, int] = {}
        self.bytes: Dict[str, int] = {}
        self.other = 0                      # bytes outside any frame (should stay 0)
        self.big = big
        self.big_at: List[Tuple[float, int, str]] = []

    def feed(self, data: bytes, n: int, now: float) -> None:
        b = self.buf
        b += data[:n]
        p = 0
        while len(b) - p >= 6:
            if b[p] != 0xA5 or b[p + 1] != 0x4E:
                p += 1
                self.other += 1
                continue
            L = b[p + 2] | (b[p + 3] << 8)
            if L < 12:
                p += 1
                self.other += 1
                continue
            if len(b) - p < L:
                break
            kind = LINK_KINDS.get(b[p + 4] & 15, "?")
            self.frames[kind] = self.frames.get(kind, 0) + 1
            self.bytes[kind] = self.bytes.get(kind, 0) + L
            if L >= self.big:
                self.big_at.append((now, L, kind))
            p += L
        del b[:p]

    def reset(self) -> None:
        self.frames, self.bytes, self.big_at = {}, {}, []

    def summary(self) -> str:
        return ", ".join("%s %d frames/%d B" % (k, self.frames[k], self.bytes[k])
                         for k in sorted(self.frames))


class PacedLine(PtyLine):
    """A serial line at ``baud`` (tools/ptyline.PtyLine: the relay is the line's rate) with a
    frame census of each direction: ``moved[0]`` / ``sniff[0]`` are gateway -> companion."""

    def __init__(self, baud: int = 115200) -> None:
        self.sniff = [FrameSniffer(), FrameSniffer()]
        super().__init__(baud, "ubrb-bench-", self._census)

    def _census(self, d: int, data: bytes, now: float) -> None:
        self.sniff[d].feed(data, len(data), now)


# -- the chain: gateway + link + companion, all as processes ---------------------------------------
class Chain:
    """``python ubrb_min.py`` + ``python -m ros_side --backend dds`` over a UDP link (``baud``
    None) or over a PacedLine at ``baud``. ``port``: the gateway's UBRB TCP port.

    ``line``: a PtyLine of the caller's (e.g. tools/impair.BerLine) instead of a PacedLine;
    ``udp_via(companion_port)``: the UDP port the gateway sends to instead of the companion's
    (a proxy's, e.g. tools/impair.UdpImpairProxy). The chain closes a line it was given.
    ``backend``, ``python``, ``env``, ``domain``: the companion's backend, interpreter (the
    rclpy backend needs the Kilted venv's), environment and DDS domain (a real-ROS test's, e.g.
    tests/support/ros_procs.ros_env: Fast DDS peers do not carry this run's Cyclone tag)."""

    def __init__(self, baud: Optional[int] = None, gateway_args: Tuple[str, ...] = (),
                 companion_args: Tuple[str, ...] = (), line: Optional[PtyLine] = None,
                 udp_via: Optional[Callable[[int], int]] = None, backend: str = "dds",
                 python: str = sys.executable, env: Optional[Dict[str, str]] = None,
                 domain: int = DOMAIN) -> None:
        # a PacedLine (its .sniff) unless the caller gave its own line
        self.line: Any = line
        self.gw: Optional[Proc] = None
        self.comp: Optional[Proc] = None
        self.port = free_port()
        self.env = env
        py = sys.executable
        try:
            if baud is None:
                lport = free_port(socket.SOCK_DGRAM)
                gw_link = comp_link = "udp://127.0.0.1:%d" % lport
                if udp_via is not None:
                    gw_link = "udp://127.0.0.1:%d" % udp_via(lport)
                serial: Tuple[str, ...] = ()
            else:
                if self.line is None:
                    self.line = PacedLine(baud)
                gw_link, comp_link = self.line.url("gw"), self.line.url("comp")
                serial = ("--baud", str(baud))
            self.comp_argv = [python, "-m", "ros_side", "--backend", backend, "--domain", str(domain),
                              "--link", comp_link, *serial, *companion_args]
            self.start_companion()
            # every bench client connects from 127.0.0.1: let it use every client slot
            self.gw = Proc([py, "ubrb_min.py", "--listen", "127.0.0.1:%d" % self.port,
                            "--link", gw_link, *serial, "--max-clients-per-address", "8",
                            *gateway_args], env)
            wait_for(self._accepting, 20.0)
            # it serves clients at once: the chain is ready once the gateway's link is up
            self.gw.wait_line(r"ROS side up", 20.0)
        except BaseException:
            self.close()
            raise

    def start_companion(self) -> None:
        """(Re)start the companion: a new process, the same link address."""
        self.comp = Proc(self.comp_argv, self.env)
        self.comp.wait_line(r"companion on link")

    def _accepting(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
            return True
        except OSError:
            return False

    def close(self) -> str:
        """Stop everything; the gateway's output (its final counters included)."""
        out = ""
        if self.gw is not None:
            self.gw.stop()
            out = self.gw.output()
        if self.comp is not None:
            self.comp.stop()
        if self.line is not None:
            self.line.close()
        return out


def last_counters(output: str, group: str = "link") -> Dict[str, Any]:
    """The non-zero counters of one group from the table a program logs when it stops
    (``  link.timeouts   17``), or {}."""
    found: Dict[str, Any] = {}
    for name, value in re.findall(r"^.*?\s" + re.escape(group) + r"\.(\w+)\s+(\d+)\s*$", output,
                                  re.M):
        found[name] = int(value)
    return found


def wait_for(cond: Callable[[], Any], timeout: float = 5.0, step: float = 0.01) -> Any:
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v or time.monotonic() >= end:
            return v
        time.sleep(step)


# -- UBRB clients --------------------------------------------------------------------------------
class RawClient:
    """A UBRB client on a plain blocking TCP socket: ``firehose`` writes PUBLISH frames as fast
    as TCP takes them (like a UE plugin flushing a deep queue); a reader thread collects ERROR
    frames and MESSAGE payloads."""

    def __init__(self, port: int, name: str = "bench") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.errors: List[dict] = []
        self.messages: Dict[int, List[Tuple[float, bytes]]] = {}
        self.hello = threading.Event()
        self.pong = threading.Event()
        self.closed = False
        self.lock = threading.Lock()
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()
        self.send(F.encode_json_frame(F.HELLO, {"protocol": 1, "client": name}))
        if not self.hello.wait(10):
            raise RuntimeError("no HELLO_ACK")

    def send(self, data: bytes) -> None:
        with self.lock:
            self.sock.sendall(data)

    def advertise(self, id_: int, topic: str, qos: dict, type_: str = STRING_TYPE) -> None:
        self.send(F.encode_json_frame(F.ADVERTISE, {"id": id_, "topic": topic, "type": type_,
                                                    "qos": qos}))

    def subscribe(self, id_: int, topic: str, qos: dict, type_: str = STRING_TYPE) -> None:
        self.send(F.encode_json_frame(F.SUBSCRIBE, {"id": id_, "topic": topic, "type": type_,
                                                    "qos": qos}))

    def publish(self, id_: int, cdr: bytes) -> None:
        self.send(F.encode_data_frame(F.PUBLISH, id_, cdr))

    def firehose(self, id_: int, make: Callable[[int], bytes], count: int,
                 batch: int = 64) -> float:
        """Send ``count`` PUBLISH frames (``make(i)`` CDR) back to back; seconds taken."""
        t0 = time.monotonic()
        for i in range(0, count, batch):
            self.send(b"".join(F.encode_data_frame(F.PUBLISH, id_, make(k))
                               for k in range(i, min(count, i + batch))))
        return time.monotonic() - t0

    def sync(self, timeout: float = 10.0) -> bool:
        self.pong.clear()
        self.send(F.encode_frame(F.PING))
        return self.pong.wait(timeout)

    def _read(self) -> None:
        import json
        dec = F.FrameDecoder()
        self.sock.settimeout(None)
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                return
            now = time.monotonic()
            for op, payload in dec.feed(chunk):
                if op == F.HELLO_ACK:
                    self.hello.set()
                elif op == F.PONG:
                    self.pong.set()
                elif op == F.PING:
                    self.send(F.encode_frame(F.PONG))
                elif op == F.ERROR:
                    self.errors.append(json.loads(bytes(payload)))
                elif op == F.MESSAGE:
                    sid, cdr = F.split_data_payload(payload)
                    self.messages.setdefault(sid, []).append((now, bytes(cdr)))
                self.on_frame(op, payload, now)

    def on_frame(self, op: int, payload: Any, now: float) -> None:
        """Every frame received, after the above (a bench's client adds what it watches)."""

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.t.join(5)


# -- DDS, from outside ----------------------------------------------------------------------------
_DP: Any = None


def participant() -> Any:
    """The independent DDS participant of this process (loopback, this run's tag)."""
    global _DP
    if _DP is None:
        from cyclonedds.domain import DomainParticipant
        _DP = DomainParticipant(DOMAIN)
    return _DP


def use_participant(p: Any) -> None:
    """Use ``p`` (a participant already made in this run's domain, e.g. a test session's) instead
    of creating one: Cyclone refuses an explicit Domain once a participant made it implicitly."""
    global _DP
    if _DP is not None and _DP is not p:
        raise RuntimeError("chainkit already has a participant")
    _DP = p


_TOPICS: Dict[str, Any] = {}


def string_topic(ros_topic: str) -> Any:
    from cyclonedds.topic import Topic
    if ros_topic not in _TOPICS:
        _TOPICS[ros_topic] = Topic(participant(), "rt" + ros_topic, _string_class())
    return _TOPICS[ros_topic]


_STRING_CLS: Any = None


def _string_class() -> Any:
    global _STRING_CLS
    if _STRING_CLS is None:
        from cyclonedds.idl import make_idl_struct
        _STRING_CLS = make_idl_struct("String_", STRING_DDS, {"data": str})
    return _STRING_CLS


def dds_qos(reliable: bool, depth: int) -> Any:
    from cyclonedds.qos import Policy, Qos
    return Qos(Policy.Reliability.Reliable(10 ** 10) if reliable else Policy.Reliability.BestEffort,
               Policy.Durability.Volatile, Policy.History.KeepLast(depth),
               Policy.ResourceLimits(max_samples=-1, max_instances=-1,
                                     max_samples_per_instance=-1))


def dds_reader(ros_topic: str, reliable: bool = True, depth: int = 1 << 17) -> Any:
    """A raw-capable reader on a ROS String topic with a deep queue (nothing it is sent is
    dropped on its side)."""
    from cyclonedds.sub import DataReader
    return DataReader(participant(), string_topic(ros_topic), qos=dds_qos(reliable, depth))


def dds_writer(ros_topic: str, reliable: bool = True, depth: int = 1 << 17) -> Any:
    from cyclonedds.pub import DataWriter
    return DataWriter(participant(), string_topic(ros_topic), qos=dds_qos(reliable, depth))


def matched(entity: Any) -> int:
    from cyclonedds.pub import DataWriter
    if isinstance(entity, DataWriter):
        return int(entity.get_publication_matched_status().current_count)
    return int(entity.get_subscription_matched_status().current_count)


def take_raw(reader: Any, n: int = 256, writers: Optional[List[int]] = None) -> List[bytes]:
    """Serialized samples (encapsulation header included) taken from ``reader``; ``writers``
    gets the instance handle of the DDS writer of each (which process wrote it)."""
    from cyclonedds._clayer import ddspy_take
    got = ddspy_take(reader._ref, 0xFFFF, n)
    if isinstance(got, int):
        return []
    if writers is not None:
        writers.extend(info.publication_handle for d, info in got if info.valid_data)
    return [d for d, info in got if info.valid_data]


def write_raw(writer: Any, cdr: bytes) -> None:
    from cyclonedds._clayer import ddspy_write
    r = ddspy_write(writer._ref, cdr)
    if r < 0:
        raise RuntimeError("ddspy_write: %d" % r)


class Collector:
    """Takes raw samples from a reader in a background thread, stamping their arrival."""

    def __init__(self, reader: Any, writers: bool = False) -> None:
        self.reader = reader
        self.got: List[Tuple[float, bytes]] = []
        # with ``writers``: the DDS writer (instance handle) of each sample in ``got``
        self.writers: Optional[List[int]] = [] if writers else None
        self.bytes = 0
        self._stop = False
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self) -> None:
        while not self._stop:
            got = take_raw(self.reader, 1024, self.writers)
            if not got:
                time.sleep(0.0005)
                continue
            now = time.monotonic()
            for d in got:
                self.got.append((now, d))
                self.bytes += len(d)

    def count(self) -> int:
        return len(self.got)

    def stop(self) -> List[Tuple[float, bytes]]:
        self._stop = True
        self.t.join(5)
        return self.got


def check_order(samples: List[bytes], clients: int, per_client: int) -> Dict[str, Any]:
    """Delivery check of tagged samples: {'delivered', 'lost', 'duplicates', 'out_of_order'}."""
    seen: Dict[Tuple[int, int], int] = {}
    last = [-1] * clients
    ooo = 0
    for d in samples:
        c, s = tag_of(d)
        seen[(c, s)] = seen.get((c, s), 0) + 1
        if seen[(c, s)] == 1:
            if s < last[c]:
                ooo += 1
            last[c] = max(last[c], s)
    dup = sum(v - 1 for v in seen.values())
    return {"delivered": len(seen), "lost": clients * per_client - len(seen),
            "duplicates": dup, "out_of_order": ooo}


def steady_rate(times: List[float]) -> float:
    """Messages per second between the arrival of the message at 10 % and the one at 90 % of
    those delivered: the sustained rate, measured the same way for every path, without the
    ramp-up (first window, scheduling) or the tail (last acknowledgements)."""
    n = len(times)
    if n < 10:
        return 0.0
    a, b = n // 10, (9 * n) // 10
    span = times[b] - times[a]
    return (b - a) / span if span > 0 else 0.0


def percentiles(vals: List[float]) -> Dict[str, float]:
    v = sorted(vals)
    if not v:
        return {}

    def q(p: float) -> float:
        return v[min(len(v) - 1, int(round(p * (len(v) - 1))))]
    return {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": v[-1]}


# -- the bare DDS writer process ----------------------------------------------------------------
def _dds_writer_main(a: argparse.Namespace) -> int:
    from cyclonedds.pub import DataWriter
    from cyclonedds.util import duration

    from cyclonedds.domain import Domain

    from ros_side.backends.dds import build_config, make_qos
    # The very Cyclone configuration (this run's loopback one plus the companion's own settings:
    # fragment size, heartbeats) and QoS (reliable, volatile, depth 10: KEEP_LAST(10), XCDR1,
    # ...) the companion's writer has for the chain's topic, so both paths write into DDS the
    # same way.
    domain = Domain(DOMAIN, build_config())  # noqa: F841  (held: the domain lives while it is)
    w = DataWriter(participant(), string_topic(a.topic),
                   qos=make_qos(dict(QOS_R, depth=a.depth or QOS_R["depth"]), True))
    if not wait_for(lambda: matched(w) > 0, 20.0):
        print("no reader matched", flush=True)
        return 1
    time.sleep(0.5)                           # both sides' discovery settled
    print("writing", flush=True)
    t0 = time.monotonic()
    for i in range(a.count):
        write_raw(w, tagged_cdr(0, i, a.size))
    print("wrote %d in %.3f s" % (a.count, time.monotonic() - t0), flush=True)
    w.wait_for_acks(duration(seconds=30))     # reliable: stay until the reader has them all
    return 0


# -- a UBRB client process (a UE world's stand-in) ----------------------------------------------
def _ubrb_writer_main(a: argparse.Namespace) -> int:
    # taken only by sigwait (the reader thread inherits the mask)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGTERM})
    c = RawClient(a.port, "tp%d" % a.client)
    c.advertise(1, a.topic, QOS_R)
    if not c.sync():
        print("no PONG from the gateway", flush=True)
        return 1
    print("ready", flush=True)
    signal.sigwait({signal.SIGUSR1})
    took = c.firehose(1, lambda i: tagged_cdr(a.client, i, a.size), a.count)
    print("sent %d in %.3f s" % (a.count, took), flush=True)
    # connected until told: frames the gateway holds back (backpressure) are still this
    # connection's, and a close would end them
    signal.sigwait({signal.SIGTERM})
    print("errors: %s" % " ".join(str(e.get("code", "?")) for e in c.errors), flush=True)
    c.close()
    return 0


def build_parser() -> argparse.ArgumentParser:
    """`bench/chainkit.py dds-writer|ubrb-writer ...`: the processes the chain benches start."""
    sys.path.insert(0, os.path.join(ROOT, "ports", "cpython"))
    from ubrb_host import cli as host_cli
    import ubrb_min

    p = host_cli.Parser(prog="bench/chainkit.py", description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    host_cli.add_program_arguments(p, ubrb_min.VERSION)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dds-writer", help="the bare DDS writer of bench/chain_throughput.py",
                       description="bare cyclonedds-python writer of tagged Strings, with the "
                                   "companion's writer QoS")
    d.add_argument("--topic", required=True)
    d.add_argument("--count", type=host_cli.positive_int, required=True)
    d.add_argument("--size", type=host_cli.positive_int, default=1024)
    d.add_argument("--depth", type=host_cli.positive_int, default=0,
                   help="the writer's KEEP_LAST depth (default: the companion's, 10)")
    d.set_defaults(func=_dds_writer_main)
    u = sub.add_parser(
        "ubrb-writer", help="one UBRB client of the chain",
        description="one UBRB client: advertises TOPIC reliable, prints 'ready', and on SIGUSR1 "
                    "sends COUNT tagged PUBLISH frames back to back, building them as it goes (as "
                    "the bare DDS writer builds its samples); stays connected until SIGTERM, then "
                    "prints the ERROR codes it got")
    u.add_argument("--port", type=host_cli.port_number, required=True)
    u.add_argument("--topic", required=True)
    u.add_argument("--count", type=host_cli.positive_int, required=True)
    u.add_argument("--client", type=int, default=0, help="the tag's client number")
    u.add_argument("--size", type=host_cli.positive_int, default=1024)
    u.set_defaults(func=_ubrb_writer_main)
    return p


if __name__ == "__main__":
    _args = build_parser().parse_args()
    sys.exit(_args.func(_args))

"""A ROS-side observer and a bench echo: a plain cyclonedds participant, no ROS installation.

    python tools/ros_observer.py watch [--domain N] [--drive] [--duration S]
    python tools/ros_observer.py echo  [--domain N] [--qos auto|reliable|best_effort] [--duration S]

``watch`` subscribes the simulated robot's topics (``python -m ubrb_client sim``) and the
companion's ``/diagnostics`` and prints a table once a second: rate, bytes/s and message count
per topic, the robot's pose from ``/odom`` and the drop counters the companion reports (its own,
the link's and, when the gateway sends them over the link, the gateway's). ``--drive`` also
publishes ``/cmd_vel``: a slow circle (linear.x 0.5 m/s, angular.z 0.3 rad/s) at 10 Hz, paused
for 2 s every 5 s so the robot visibly stops (the sim stops 0.5 s after the last command).
``tools/demo.py`` (``make demo``) runs the same observer in its own process.

``echo`` is the ROS-side half of ``python -m ubrb_client bench``: it republishes every
``/ubrb_bench/ping`` sample unchanged, as raw CDR, on ``/ubrb_bench/pong``.

DDS: ROS 2 wire conventions through ``ros_side``'s DdsBackend (raw CDR readers and writers,
types from the rosbags typestore). Unless ``CYCLONEDDS_URI`` is already set, the loopback-only
configuration of ``shared/design/ROS-NOTES.md`` is applied (``--loopback`` forces it), so no
packet leaves the machine. Domain: ``--domain``, else ``ROS_DOMAIN_ID``, else 0.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import signal
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (ROOT, os.path.join(ROOT, "ports", "cpython")):  # the repo, the shared runtime
    if _path not in sys.path:
        sys.path.insert(0, _path)

from ubrb_host import cli as host_cli  # noqa: E402

DDS_MISSING: Optional[ImportError] = None
try:
    from ros_side.backends.dds import LOOPBACK_XML  # noqa: E402  (no DDS entity on import)
except ImportError as _missing:
    if __name__ != "__main__":
        raise  # an importer (tools/demo.py) says so itself
    DDS_MISSING, LOOPBACK_XML = _missing, ""  # main() says so in one line

QosDict = Dict[str, Any]


def qos(reliability: str, depth: int, durability: str = "volatile") -> QosDict:
    return {"reliability": reliability, "durability": durability, "depth": depth}


# What the observer watches: (topic, type, reader QoS). Reliable readers where the sim's
# publisher is reliable (as a tf2 listener or nav stack would subscribe), best effort for sensor
# data; transient_local for /tf_static so the latched message arrives however late we join.
WATCH: List[Tuple[str, str, QosDict]] = [
    ("/clock", "rosgraph_msgs/msg/Clock", qos("best_effort", 1)),
    ("/tf", "tf2_msgs/msg/TFMessage", qos("reliable", 100)),
    ("/tf_static", "tf2_msgs/msg/TFMessage", qos("reliable", 1, "transient_local")),
    ("/odom", "nav_msgs/msg/Odometry", qos("reliable", 10)),
    ("/imu", "sensor_msgs/msg/Imu", qos("best_effort", 5)),
    ("/scan", "sensor_msgs/msg/LaserScan", qos("best_effort", 5)),
    ("/diagnostics", "diagnostic_msgs/msg/DiagnosticArray", qos("reliable", 10)),
]
LATCHED = {"/tf_static"}
ROBOT_TOPICS = ("/clock", "/tf", "/odom", "/imu", "/scan")  # what "the robot is seen" means
CMD_VEL = ("/cmd_vel", "geometry_msgs/msg/Twist", qos("reliable", 10))
ODOM = "/odom"
DIAGNOSTICS = "/diagnostics"

# /cmd_vel pattern: a slow circle, paused regularly so the robot visibly stops.
DRIVE_V = 0.5
DRIVE_W = 0.3
DRIVE_HZ = 10.0
DRIVE_S = 5.0
PAUSE_S = 2.0

BENCH_TYPE = "std_msgs/msg/UInt8MultiArray"  # ubrb_client/bench.py
PING_TOPIC = "/ubrb_bench/ping"
PONG_TOPIC = "/ubrb_bench/pong"

# Counters in the companion's /diagnostics that count lost or refused messages.
DROP_KEYS = {
    "ros_side: companion": ("queue_drops", "too_large_drops", "pub_dropped", "pub_errors"),
    "ros_side: link": ("drop_be", "drop_be_down", "drop_rel_full", "drop_down", "too_large",
                       "frag_drop", "pub_congested", "pub_too_large"),
    "ros_side: gateway": ("dropped_no_ros", "dropped_queue", "evicted", "queue_refused"),
}
DROP_GROUPS = (("gateway", "ros_side: gateway"), ("link", "ros_side: link"),
               ("companion", "ros_side: companion"))

_ANY_STATE = 0x7F  # SampleState.Any | ViewState.Any | InstanceState.Any (ddspy_take mask)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TWIST = struct.Struct("<4s6d")  # CDR: encapsulation header, then six float64 (no padding)


def _status_key(name: str) -> str:
    """'/robot1/ros_side: link' -> 'ros_side: link': the companion names its statuses by its
    node's fully qualified name (docs/COMPANION.md, "Diagnostics"); here they go by source."""
    node, sep, source = name.rpartition(": ")
    if sep and node.startswith("/") and source in ("companion", "gateway", "link"):
        return "ros_side: " + source
    return name


def twist_cdr(vx: float, wz: float) -> bytes:
    return _TWIST.pack(b"\x00\x01\x00\x00", vx, 0.0, 0.0, 0.0, 0.0, wz)


def use_loopback(force: bool = False) -> bool:
    """Put the loopback-only Cyclone configuration into the environment (read at domain
    creation, also by child processes). Returns True if it is now in effect."""
    if force or not os.environ.get("CYCLONEDDS_URI"):
        os.environ["CYCLONEDDS_URI"] = LOOPBACK_XML
        return True
    return os.environ["CYCLONEDDS_URI"] == LOOPBACK_XML


def default_domain() -> int:
    """ROS_DOMAIN_ID (checked: a bad value is one line and exit 2), else 0."""
    d = host_cli.env_domain()
    return 0 if d is None else d


# ------------------------------------------------------------------------------------- stats
@dataclass
class TopicStat:
    topic: str
    type: str
    count: int = 0
    nbytes: int = 0
    first: Optional[float] = None
    last_time: Optional[float] = None
    last: Optional[bytes] = None  # kept only for the topics we decode
    keep_last: bool = False


@dataclass
class Row:
    topic: str
    type: str
    rate: float          # Hz over the last interval (or the whole run for summaries)
    bps: float           # bytes per second, same interval
    count: int
    latched: bool = False
    outgoing: bool = False


@dataclass
class Pose:
    x: float
    y: float
    yaw: float
    v: float
    w: float


@dataclass
class Snapshot:
    t: float                                 # seconds since the observer started
    rows: List[Row]
    pose: Optional[Pose]
    drive: str                               # "driving …", "paused …" or ""
    drops: Dict[str, Optional[Dict[str, int]]] = field(default_factory=dict)  # group -> counters
    diag_age: Optional[float] = None
    extra: Dict[str, str] = field(default_factory=dict)                       # link rtt, retx


def quat_yaw(x: float, y: float, z: float, w: float) -> float:
    return math.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))


def _int(v: Any) -> Optional[int]:
    try:
        return int(str(v))
    except ValueError:
        return None


class Observer:
    """The robot's topics and /diagnostics on DDS; optionally drives /cmd_vel."""

    def __init__(self, domain: int, distro: str = "humble",
                 watch: Sequence[Tuple[str, str, QosDict]] = WATCH) -> None:
        from ros_side.backends.dds import DdsBackend

        self.backend = DdsBackend(domain=domain, distro=distro)
        self.store = self.backend.types.store
        self.domain = domain
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.stats: Dict[str, TopicStat] = {}
        self._subs: Dict[str, Any] = {}
        self._diag_reader: Any = None
        self._diag_owner: Dict[int, Any] = {}   # publication handle -> participant key
        self._ours: Any = None                  # participant key of the robot's companion
        self.foreign_diag = 0
        for topic, rtype, q in watch:
            st = TopicStat(topic, rtype, keep_last=topic in (ODOM, DIAGNOSTICS))
            self.stats[topic] = st
            if topic == DIAGNOSTICS:
                self._diag_reader = self._raw_reader(topic, rtype, q)
            else:
                self._subs[topic] = self.backend.create_subscription(topic, rtype, q,
                                                                     self._cb(st))
        self._prev: Dict[str, Tuple[int, int]] = {t: (0, 0) for t in self.stats}
        self._prev_t = self.t0
        self._cmd_pub: Any = None
        self.cmd = TopicStat(CMD_VEL[0], CMD_VEL[1])
        self._prev_cmd = (0, 0)
        self._drive_thread: Optional[threading.Thread] = None
        self._drive_t0 = 0.0
        self._stop = threading.Event()
        self.drive_state = ""
        self.start_pose: Optional[Pose] = None
        self.travelled = 0.0                 # m, summed over the snapshots' poses
        self._last_pose: Optional[Pose] = None
        self.closed = False

    def _cb(self, st: TopicStat) -> Callable[[bytes], None]:
        lock = self.lock

        def on_data(data: bytes) -> None:
            now = time.monotonic()
            with lock:
                st.count += 1
                st.nbytes += len(data)
                if st.first is None:
                    st.first = now
                st.last_time = now
                if st.keep_last:
                    st.last = data

        return on_data

    # -- /diagnostics: only our companion's ---------------------------------------------------
    # Every companion (and any ROS node) on the domain publishes /diagnostics; the one that
    # serves the robot is the participant that writes the /odom we receive. Its samples are
    # picked by their writer's participant (the SampleInfo of a raw take), so another
    # companion on the same domain cannot mix its counters into the table.
    def _raw_reader(self, topic: str, rtype: str, q: QosDict) -> Any:
        from cyclonedds.sub import DataReader
        from cyclonedds.topic import Topic

        from ros_side.backends.dds import make_qos
        from ros_side.names import dds_topic_name

        dp = self.backend.dp
        t = Topic(dp, dds_topic_name(topic), self.backend.types.idl_type(rtype))
        return DataReader(dp, t, qos=make_qos(q, False))

    def _our_participant(self) -> Any:
        if self._ours is None:
            sub = self._subs.get(ODOM)
            r = sub.reader if sub is not None else None
            if r is not None:
                pubs = r.get_matched_publications()
                if len(pubs) == 1:
                    ep = r.get_matched_publication_data(pubs[0])
                    self._ours = ep.participant_key if ep is not None else None
        return self._ours

    def _poll_diagnostics(self) -> None:
        from cyclonedds._clayer import ddspy_take

        r = self._diag_reader
        st = self.stats.get(DIAGNOSTICS)
        if r is None or st is None:
            return
        ours = self._our_participant()
        while True:
            got = ddspy_take(r._ref, _ANY_STATE, 32)
            if isinstance(got, int) or not got:
                return
            now = time.monotonic()
            for data, info in got:
                if not info.valid_data:
                    continue
                h = info.publication_handle
                if h not in self._diag_owner:
                    ep = r.get_matched_publication_data(h)
                    self._diag_owner[h] = ep.participant_key if ep is not None else None
                if ours is not None and self._diag_owner[h] != ours:
                    self.foreign_diag += 1
                    continue
                with self.lock:
                    st.count += 1
                    st.nbytes += len(data)
                    if st.first is None:
                        st.first = now
                    st.last_time = now
                    st.last = data
            if len(got) < 32:
                return

    # -- discovery ------------------------------------------------------------------------------
    def seen(self, topics: Sequence[str]) -> List[str]:
        """The topics among ``topics`` that have not delivered a message yet."""
        self._poll_diagnostics()
        with self.lock:
            return [t for t in topics if t in self.stats and self.stats[t].count == 0]

    def cmd_matched(self) -> int:
        """Readers of /cmd_vel matched by our writer (the companion's, once the sim subscribed)."""
        if self._cmd_pub is None:
            self._cmd_pub = self.backend.create_publisher(*CMD_VEL)
        return int(self.backend.subscription_count(self._cmd_pub))

    # -- driving --------------------------------------------------------------------------------
    def start_driving(self) -> None:
        if self._drive_thread is not None:
            return
        if self._cmd_pub is None:
            self._cmd_pub = self.backend.create_publisher(*CMD_VEL)
        self.start_pose = self._last_pose = self.pose()
        self._drive_t0 = time.monotonic()
        self._drive_thread = threading.Thread(target=self._drive, name="observer-cmd_vel",
                                              daemon=True)
        self._drive_thread.start()

    def _drive(self) -> None:
        period = 1.0 / DRIVE_HZ
        data = twist_cdr(DRIVE_V, DRIVE_W)
        next_t = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            phase = (now - self._drive_t0) % (DRIVE_S + PAUSE_S)
            if phase < DRIVE_S:
                self.drive_state = "driving: v %.2f m/s, w %.2f rad/s (pause in %.0f s)" % (
                    DRIVE_V, DRIVE_W, math.ceil(DRIVE_S - phase))
                try:
                    self.backend.publish(self._cmd_pub, data)
                except Exception as e:  # pragma: no cover - participant closed under us
                    self.drive_state = "cmd_vel publish failed: %s" % e
                    return
                with self.lock:
                    self.cmd.count += 1
                    self.cmd.nbytes += len(data)
            else:
                self.drive_state = ("paused, nothing sent: the robot stops by itself "
                                    "(again in %.0f s)" % math.ceil(DRIVE_S + PAUSE_S - phase))
            next_t += period
            self._stop.wait(max(0.0, next_t - time.monotonic()))

    # -- decoding -------------------------------------------------------------------------------
    def pose(self) -> Optional[Pose]:
        with self.lock:
            raw = self.stats[ODOM].last if ODOM in self.stats else None
        if raw is None:
            return None
        m = self.store.deserialize_cdr(raw, "nav_msgs/msg/Odometry")
        p, q = m.pose.pose.position, m.pose.pose.orientation
        return Pose(p.x, p.y, quat_yaw(q.x, q.y, q.z, q.w), m.twist.twist.linear.x,
                    m.twist.twist.angular.z)

    def diagnostics(self) -> Tuple[Dict[str, Dict[str, str]], Optional[float]]:
        """{status name: {key: value}} of the latest /diagnostics, and its age in seconds."""
        self._poll_diagnostics()
        with self.lock:
            st = self.stats.get(DIAGNOSTICS)
            raw = st.last if st else None
            when = st.last_time if st else None
        if raw is None or when is None:
            return {}, None
        m = self.store.deserialize_cdr(raw, "diagnostic_msgs/msg/DiagnosticArray")
        out = {_status_key(s.name): {kv.key: kv.value for kv in s.values} for s in m.status}
        return out, time.monotonic() - when

    def drops(self) -> Tuple[Dict[str, Optional[Dict[str, int]]], Optional[float], Dict[str, str]]:
        diag, age = self.diagnostics()
        drops: Dict[str, Optional[Dict[str, int]]] = {}
        for short, name in DROP_GROUPS:
            vals = diag.get(name)
            if vals is None:
                drops[short] = None
                continue
            d: Dict[str, int] = {}
            for k in DROP_KEYS[name]:
                n = _int(vals.get(k, "0"))
                if n:
                    d[k] = n
            drops[short] = d
        extra: Dict[str, str] = {}
        link = diag.get("ros_side: link", {})
        for k in ("srtt_ms", "retx"):
            if k in link:
                extra[k] = link[k]
        return drops, age, extra

    # -- snapshots ------------------------------------------------------------------------------
    def snapshot(self, whole_run: bool = False) -> Snapshot:
        """Rates since the previous snapshot (or, with ``whole_run``, averages from each topic's
        first message to its last) and the current pose and counters."""
        self._poll_diagnostics()
        now = time.monotonic()
        rows: List[Row] = []
        with self.lock:
            dt = max(now - self._prev_t, 1e-6)
            for topic, st in self.stats.items():
                latched = topic in LATCHED
                if whole_run:
                    span = (st.last_time or now) - (st.first or now)
                    n = st.count - 1 if st.count > 1 else 0
                    rate = n / span if span > 0 else 0.0
                    bps = st.nbytes * rate / st.count if st.count else 0.0
                else:
                    pc, pb = self._prev[topic]
                    rate = (st.count - pc) / dt
                    bps = (st.nbytes - pb) / dt
                    self._prev[topic] = (st.count, st.nbytes)
                rows.append(Row(topic, st.type, rate, bps, st.count, latched=latched))
            if self._drive_thread is not None:
                if whole_run:
                    span = max(now - self._drive_t0, 1e-6)
                    rate, bps = self.cmd.count / span, self.cmd.nbytes / span
                else:
                    rate = (self.cmd.count - self._prev_cmd[0]) / dt
                    bps = (self.cmd.nbytes - self._prev_cmd[1]) / dt
                    self._prev_cmd = (self.cmd.count, self.cmd.nbytes)
                rows.append(Row(self.cmd.topic, self.cmd.type, rate, bps, self.cmd.count,
                                outgoing=True))
            if not whole_run:
                self._prev_t = now
        drops, age, extra = self.drops()
        drive = "" if whole_run else self.drive_state
        pose = self.pose()
        if pose is not None and self._drive_thread is not None:
            if self._last_pose is not None:
                self.travelled += math.hypot(pose.x - self._last_pose.x,
                                             pose.y - self._last_pose.y)
            self._last_pose = pose
        return Snapshot(now - self.t0, rows, pose, drive, drops, age, extra)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._stop.set()
        if self._drive_thread is not None:
            self._drive_thread.join(1.0)
        self.backend.close()


# ------------------------------------------------------------------------------------- table
class Style:
    def __init__(self, color: bool) -> None:
        self.color = color

    def _c(self, code: str, s: str) -> str:
        return "\x1b[%sm%s\x1b[0m" % (code, s) if self.color else s

    def bold(self, s: str) -> str:
        return self._c("1", s)

    def dim(self, s: str) -> str:
        return self._c("2", s)

    def green(self, s: str) -> str:
        return self._c("32", s)

    def yellow(self, s: str) -> str:
        return self._c("33", s)

    def red(self, s: str) -> str:
        return self._c("31", s)

    def cyan(self, s: str) -> str:
        return self._c("36", s)


def human_rate(bps: float) -> str:
    if bps < 1000:
        return "%.0f B/s" % bps
    if bps < 1e6:
        return "%.1f kB/s" % (bps / 1e3)
    return "%.2f MB/s" % (bps / 1e6)


def render(snap: Snapshot, style: Style, title: str = "", whole_run: bool = False) -> List[str]:
    """The table as lines (no trailing newlines)."""
    s = style
    lines: List[str] = []
    if title:
        lines.append(s.bold(title))
    # 79 columns with the sim's types: fits an 80-column terminal
    tw = max([len(r.type) for r in snap.rows] + [4])
    lines.append(s.bold("%-14s %-*s %9s %10s %7s" % ("topic", tw, "type",
                                                   "avg rate" if whole_run else "rate",
                                                   "bytes/s", "msgs")))
    for r in snap.rows:
        name = r.topic + (" (out)" if r.outgoing else "")
        if r.latched:
            rate = "latched" if r.count else "-"
            rate_s = "%9s" % rate
            bps_s = "%10s" % "-"
        else:
            rate_s = "%6.1f Hz" % r.rate
            bps_s = "%10s" % human_rate(r.bps)
        line = "%-14s %-*s %s %s %7d" % (name, tw, r.type, rate_s, bps_s, r.count)
        if r.count == 0 or (not r.latched and r.rate == 0):
            line = s.yellow(line)
        elif r.outgoing:
            line = s.cyan(line)
        lines.append(line)
    p = snap.pose
    if p is None:
        lines.append("pose (/odom)   " + s.yellow("no /odom yet"))
    else:
        lines.append("pose (/odom)   x %+6.2f  y %+6.2f m  yaw %+6.1f deg  v %+5.2f m/s  "
                     "w %+5.2f rad/s" % (p.x, p.y, math.degrees(p.yaw), p.v, p.w))
    if snap.drive:
        lines.append("/cmd_vel (out) " + snap.drive)
    parts = []
    total = 0
    for short, _ in DROP_GROUPS:
        d = snap.drops.get(short)
        if d is None:
            parts.append("%s n/a" % short)
            continue
        n = sum(d.values())
        total += n
        txt = "%s %d" % (short, n)
        if n:
            txt += " (" + ", ".join("%s %d" % kv for kv in sorted(d.items())) + ")"
        parts.append(txt)
    if snap.diag_age is None:
        drop_line = "drops          " + s.yellow("no /diagnostics yet")
    else:
        body = " | ".join(parts)
        body = s.red(body) if total else s.green(body)
        extra = ""
        if snap.extra:
            extra = "   link: " + ", ".join(
                "%s %s" % ("rtt" if k == "srtt_ms" else k, v + (" ms" if k == "srtt_ms" else ""))
                for k, v in sorted(snap.extra.items()))
        drop_line = "drops          " + body + extra
    lines.append(drop_line)
    return lines


class LiveTable:
    """Prints a block of lines once a second: redrawn in place on a terminal, appended (with a
    blank line between blocks) otherwise."""

    def __init__(self, out: Any, inplace: bool) -> None:
        self.out = out
        self.inplace = inplace
        self.height = 0

    def show(self, lines: List[str]) -> None:
        if self.inplace:
            buf = ""
            if self.height:
                buf += "\x1b[%dF\x1b[J" % self.height  # up to the block's first line, clear below
            buf += "\n".join(lines) + "\n"
            self.out.write(buf)
            # rows on screen: a line longer than the terminal is wide wraps onto several
            width = max(shutil.get_terminal_size().columns, 20)
            self.height = sum(max(1, -(-len(_ANSI.sub("", ln)) // width)) for ln in lines)
        else:
            self.out.write("\n".join(lines) + "\n\n")
        self.out.flush()

    def forget(self) -> None:
        """Something else was printed below: start a fresh block next time."""
        self.height = 0


# -------------------------------------------------------------------------------------- echo
class Echo:
    """Republishes PING_TOPIC on PONG_TOPIC, raw, from the subscription callback.

    ``reliability`` "auto" (default) serves both kinds of bench: a reliable and a best-effort
    reader on the ping topic; a reliable ping publisher matches both, so the best-effort reader
    echoes only while the reliable one has no publisher (no duplicates). The pong writer is
    reliable, which matches both a reliable and a best-effort pong subscriber.
    """

    def __init__(self, domain: int, reliability: str = "auto", distro: str = "humble") -> None:
        from ros_side.backends.dds import DdsBackend

        self.backend = DdsBackend(domain=domain, distro=distro)
        # Deep histories: a fast bench must not lose samples in our own queues.
        self.pub = self.backend.create_publisher(PONG_TOPIC, BENCH_TYPE, qos("reliable", 1000))
        self.count = 0
        self.nbytes = 0
        self.errors = 0
        self.rel: Any = None
        if reliability in ("auto", "reliable"):
            self.rel = self.backend.create_subscription(
                PING_TOPIC, BENCH_TYPE, qos("reliable", 1000), self._on_ping)
        if reliability in ("auto", "best_effort"):
            self.backend.create_subscription(PING_TOPIC, BENCH_TYPE, qos("best_effort", 1000),
                                             self._on_ping_be)

    def _reliable_matched(self) -> bool:
        r = self.rel.reader if self.rel is not None else None
        if r is None:
            return False
        return int(r.get_subscription_matched_status().current_count) > 0

    def _on_ping_be(self, data: bytes) -> None:
        if not self._reliable_matched():
            self._on_ping(data)

    def _on_ping(self, data: bytes) -> None:
        try:
            self.backend.publish(self.pub, data)
        except Exception:
            self.errors += 1
            return
        self.count += 1
        self.nbytes += len(data)

    def close(self) -> None:
        self.backend.close()


# -------------------------------------------------------------------------------------- main
def _stop_event() -> threading.Event:
    ev = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, host_cli.set_on_signal(ev))
    return ev


def cmd_watch(args: argparse.Namespace) -> int:
    stop = _stop_event()
    style = Style(args.color)
    obs = Observer(args.domain, args.ros_distro)
    table = LiveTable(sys.stdout, args.color)
    t_end = time.monotonic() + args.duration if args.duration else None
    try:
        if args.drive:
            obs.start_driving()
        while not stop.wait(1.0):
            snap = obs.snapshot()
            table.show(render(snap, style, "ROS side, DDS domain %d  %5.0f s   (Ctrl-C to stop)"
                              % (args.domain, snap.t)))
            if t_end is not None and time.monotonic() >= t_end:
                break
    finally:
        obs.close()
    return 0


def cmd_echo(args: argparse.Namespace) -> int:
    stop = _stop_event()
    echo = Echo(args.domain, args.qos, args.ros_distro)
    print("echo: %s -> %s (%s, %s) on DDS domain %d; Ctrl-C to stop"
          % (PING_TOPIC, PONG_TOPIC, BENCH_TYPE, args.qos, args.domain), flush=True)
    t_end = time.monotonic() + args.duration if args.duration else None
    last = 0
    try:
        while not stop.wait(1.0):
            if echo.count != last and not args.quiet:
                print("echo: %d messages echoed (+%d)" % (echo.count, echo.count - last),
                      flush=True)
                last = echo.count
            if t_end is not None and time.monotonic() >= t_end:
                break
    finally:
        echo.close()
    print("echo: stopped after %d messages (%d errors)" % (echo.count, echo.errors), flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    common = host_cli.Parser(add_help=False)
    common.add_argument("--domain", type=host_cli.domain_id, default=None, metavar="N",
                        help="DDS domain id 0-232 (default: ROS_DOMAIN_ID, else 0)")
    common.add_argument("--ros-distro", default="humble", type=host_cli.ros_distro,
                        help="message definitions of this ROS 2 distro (default humble)")
    common.add_argument("--loopback", action="store_true",
                        help="force the loopback-only DDS configuration even if CYCLONEDDS_URI "
                             "is set (it is applied anyway when CYCLONEDDS_URI is unset)")
    common.add_argument("--duration", type=host_cli.duration, default=None, metavar="S",
                        help="stop after S seconds")
    import ubrb_min

    # -q also drops echo's per-second count
    host_cli.add_program_arguments(common, ubrb_min.VERSION)
    p = host_cli.Parser(prog="tools/ros_observer.py", description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version="%(prog)s " + ubrb_min.VERSION)
    sp = p.add_subparsers(dest="cmd", required=True)
    w = sp.add_parser("watch", parents=[common], help="print rates, pose and drops once a second")
    w.add_argument("--drive", action="store_true", help="also drive /cmd_vel (slow circle)")
    w.add_argument("--no-color", action="store_true", help="plain output")
    w.set_defaults(func=cmd_watch)
    e = sp.add_parser("echo", parents=[common],
                      help="republish %s on %s (for ubrb_client bench)" % (PING_TOPIC, PONG_TOPIC))
    e.add_argument("--qos", choices=("auto", "reliable", "best_effort"), default="auto",
                   help="QoS of the ping subscription (default auto: serves a bench with "
                        "either --qos)")
    e.set_defaults(func=cmd_echo)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    return host_cli.run_program("tools/ros_observer.py", run, argv)


def run(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    host_cli.setup_logging(host_cli.log_level_of(args))
    if DDS_MISSING is not None:
        raise DDS_MISSING  # the one-line "pip install '.[dds]'" of run_program
    loop = use_loopback(force=args.loopback)
    if not loop:
        print("ros_observer: using CYCLONEDDS_URI from the environment (not loopback-only)",
              file=sys.stderr)
    if args.domain is None:
        args.domain = default_domain()
    if args.cmd == "watch":
        args.color = (not args.no_color and sys.stdout.isatty()
                      and not os.environ.get("NO_COLOR"))
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

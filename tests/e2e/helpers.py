"""Helpers of the end-to-end tests: UBRB client -> gateway -> link -> companion -> DDS and back.

Everything is real: TCP sockets, the UDP link on 127.0.0.1, pseudo-terminal pairs for the serial
link, the companion as a ``python -m ros_side`` subprocess, Cyclone DDS between processes.

DDS is confined to loopback (shared/design/ROS-NOTES.md): ``tests.support.dds`` sets the loopback
``CYCLONEDDS_URI`` for this process before any participant exists, and every participant of
these tests (the independent one here, the companions) gets ``E2E_XML`` explicitly: the same
loopback configuration plus a discovery tag unique to this run (Cyclone's
``Discovery/Tag``: participants discover each other only when their tags match). So parallel
runs of any test directory cannot see each other even if they pick the same domain id; the
domain id is this process's own as well (tests/support/domains.py).

Bridges (``make_bridge(mode)``):

- ``udp`` / ``serial``: the gateway core with its CPython port (``GatewayServer`` + the link
  driver from ``ubrb_host.link.open_link``) runs in a thread of this process, so the tests can read
  ``gw.counters()`` and the link counters; the companion is a subprocess. For ``serial`` the two
  ends open the slave sides of two pty pairs whose masters a relay thread joins (no throttling;
  both ends pace their writes to ``--baud``).
- ``direct``: ``python -m ros_side --listen 127.0.0.1:0`` (gateway core inside the companion).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections import defaultdict
from typing import Any, Callable, Dict, Iterator, List, Optional

import ubrb_min as U
import ubrb_setup
from ubrb_host import link as host_link
from ubrb_host.loop import GatewayServer, mapped_buffer
from tests.support.dds import LOOPBACK_XML, confine_this_process
from tests.support.domains import test_domain
from tests.support.loopback_ports import free_port
from tests.support.procs import Proc, child_env, wait_for
from tools.ptyline import PtyLine
from tests.support.raw_client import RawClient

confine_this_process()   # before any cyclonedds domain exists in this process

# this process's own domain for tests/e2e (tests/support/domains.py)
E2E_DOMAIN = test_domain("e2e", "UBRB_E2E_DOMAIN")
E2E_TAG = "ubrb-e2e-%d-%s" % (os.getpid(), os.urandom(4).hex())
E2E_XML = LOOPBACK_XML.replace("<Discovery>", "<Discovery><Tag>%s</Tag>" % E2E_TAG, 1)
assert E2E_TAG in E2E_XML and '<NetworkInterface name="lo"/>' in E2E_XML
MODES = ["udp", "serial", "direct"]
SERIAL_BAUD = 4_000_000    # pty pairs have no line rate; both ends pace to baud/10 bytes/s


def e2e_proc(argv: List[str], env: Optional[Dict[str, str]] = None) -> Proc:
    """A process of this run: DDS on loopback, in this run's domain id and discovery tag
    (or the environment given: a real-ROS peer's)."""
    return Proc(argv, env=env or child_env(E2E_DOMAIN, E2E_XML))


def companion_argv(link: str, *extra: str, python: str = sys.executable,
                   backend: str = "dds") -> List[str]:
    return [python, "-m", "ros_side", "--backend", backend, "--domain", str(E2E_DOMAIN),
            "--link", link, "--baud", str(SERIAL_BAUD), *extra]


def key_file(tmp: Any, name: str = "link.key", data: Optional[bytes] = None) -> str:
    """A link key file (hex, mode 0600, as --link-key wants it) in folder `tmp`."""
    path = os.path.join(str(tmp), name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, (data or os.urandom(32)).hex().encode() + b"\n")
    os.close(fd)
    return path


def direct_argv(*extra: str) -> List[str]:
    return [sys.executable, "-m", "ros_side", "--backend", "dds", "--domain", str(E2E_DOMAIN),
            "--listen", "127.0.0.1:0", *extra]


# -- bridges ------------------------------------------------------------------------------------
class Bridge:
    mode = "?"
    port = 0
    gw: Any = None
    driver: Any = None

    def link_counters(self) -> Optional[Dict[str, int]]:
        return None

    def close(self) -> None:
        raise NotImplementedError


class LinkBridge(Bridge):
    """Gateway (in-process thread, real sockets) == UDP or serial link == companion (process)."""

    def __init__(self, mode: str, profile: Optional[Dict[str, int]] = None,
                 companion_args: tuple = (), key_file: Optional[str] = None,
                 companion_python: str = sys.executable, backend: str = "dds",
                 companion_env: Optional[Dict[str, str]] = None) -> None:
        self.mode = mode
        self.key_file = key_file    # --link-key on both ends
        self.companion_args = companion_args + (("--link-key", key_file) if key_file else ())
        self.companion_python = companion_python
        self.backend = backend
        self.companion_env = companion_env
        self.relay: Optional[PtyLine] = None
        self.comp: Optional[Proc] = None
        self.server: Optional[GatewayServer] = None
        self.thread: Optional[threading.Thread] = None
        self.msg_records: Dict[int, int] = defaultdict(int)   # LK_T_MSG records per sub slot
        try:
            self._start(profile or {})
        except BaseException:
            self.close()
            raise

    def _start(self, overrides: Dict[str, int]) -> None:
        if self.mode == "udp":
            cport = free_port(socket.SOCK_DGRAM)
            self.comp_url = "udp://127.0.0.1:%d" % cport
            gw_url = self.comp_url
        else:
            self.relay = PtyLine(None, "ubrb-e2e-")  # the link drivers pace their writes themselves
            self.comp_url = self.relay.url("comp")
            gw_url = self.relay.url("gw")
        self.start_companion()
        prof = ubrb_setup.make_profile("pi", overrides)
        key = ubrb_setup.parse_link_key(open(self.key_file).read()) if self.key_file else None
        session, self.driver = host_link.open_link(gw_url, True, prof["max_payload"],
                                                   baud=SERIAL_BAUD, key=key)
        self.ros = U.LinkRosPort(session)
        self._count_msg_records()
        self.gw = U.Gateway(prof, ros=self.ros, new_buffer=mapped_buffer)
        self.server = GatewayServer(self.gw, ("127.0.0.1", 0), link=self.driver)
        self.port = int(self.server.address[1])
        self.thread = threading.Thread(target=self.server.serve, args=(self._report_stats,),
                                       daemon=True, name="gateway-" + self.mode)
        self._last_stats = 0.0
        self.thread.start()
        assert wait_for(lambda: self.gw.ros_ready, 10), "link to the companion did not come up"

    def _count_msg_records(self) -> None:
        # The gateway end's LinkSession hands every record to ros.link_message: count the MSG
        # records per slot (how many times a ROS message crossed the link), then pass them on.
        inner = self.ros.link_message
        counts = self.msg_records

        def link_message(t: int, slot: int, buf: Any, off: int, n: int, reliable: bool) -> None:
            if t == U.LK_T_MSG:
                counts[slot] += 1
            inner(t, slot, buf, off, n, reliable)
        self.ros.link_message = link_message  # type: ignore[method-assign]

    def _report_stats(self) -> bool:
        # what ports/cpython/gateway.py main() does: gateway + link counters to the companion
        now = time.monotonic()
        if now - self._last_stats >= 1.0:
            self._last_stats = now
            self.ros.send_stats(self.gw.counters(), self.driver.counters())
        return False

    def start_companion(self) -> None:
        self.comp = e2e_proc(companion_argv(self.comp_url, *self.companion_args,
                                            python=self.companion_python,
                                            backend=self.backend),
                             self.companion_env)
        self.comp.wait_line(r"companion on link")

    def kill_companion(self) -> None:
        assert self.comp is not None
        self.comp.kill()

    def link_counters(self) -> Optional[Dict[str, int]]:
        return dict(self.driver.counters())

    def sub_slot(self, topic: str) -> int:
        return int(self.gw.subs.find(topic))

    def close(self) -> None:
        if self.thread is not None:
            assert self.server is not None
            self.server.stop()
            self.thread.join(10)          # serve() closes the sockets and the link on its way out
        elif self.server is not None:
            self.server.close()
        elif self.driver is not None:
            self.driver.close()
        if self.comp is not None:
            self.comp.stop()
        if self.relay is not None:
            self.relay.close()


class DirectBridge(Bridge):
    """``python -m ros_side --listen``: the gateway core runs inside the companion process."""

    mode = "direct"

    def __init__(self, extra: tuple = ()) -> None:
        self.comp = e2e_proc(direct_argv(*extra))
        try:
            m = self.comp.wait_line(r"direct mode: UBRB bridge on [\d.]+:(\d+)")
        except BaseException:
            self.comp.stop()
            raise
        self.port = int(m.group(1))

    def close(self) -> None:
        self.comp.stop()


def make_bridge(mode: str, **kw: Any) -> Bridge:
    if mode == "direct":
        return DirectBridge(**kw)
    return LinkBridge(mode, **kw)


def open_bridge(mode: str, **kw: Any) -> Iterator[Bridge]:
    """For a fixture: ``yield from open_bridge(mode)`` -- the bridge, closed when it is done."""
    b = make_bridge(mode, **kw)
    try:
        yield b
    finally:
        b.close()


# -- a small threaded UBRB client ----------------------------------------------------------------
class Client(RawClient):
    """A UBRB v1 client on a real TCP socket. A reader thread collects every frame; a PING goes
    out every 2 s so the gateway's 10 s idle timer never closes a quiet test client. It never
    reconnects: ``closed`` tells whether the gateway ended the connection."""

    def __init__(self, port: int, name: str = "e2e") -> None:
        super().__init__(port)
        self.sock.settimeout(0.1)
        self.cv = threading.Condition()
        self.frames: List[tuple] = []
        self.messages: Dict[int, List[bytes]] = defaultdict(list)
        self.errors: List[Dict[str, Any]] = []
        self.counts: List[Dict[str, int]] = []
        self.pongs = 0
        self.hello_ack: Optional[Dict[str, Any]] = None
        self.closed = False
        self.running = True
        self.t = threading.Thread(target=self._run, daemon=True, name="ubrb-client-" + name)
        self.t.start()
        self.hello(name)
        assert self.wait(lambda: self.hello_ack is not None), "no HELLO_ACK"

    def sync(self, timeout: float = 5.0) -> None:
        """PING and wait for its PONG: the gateway has handled everything sent before."""
        with self.cv:
            n = self.pongs
        self.ping()
        assert self.wait(lambda: self.pongs > n, timeout), "no PONG"

    # receiving
    def _run(self) -> None:
        last_ping = time.monotonic()
        while self.running:
            if time.monotonic() - last_ping >= 2.0:
                last_ping = time.monotonic()
                try:
                    self.ping()
                except OSError:
                    pass
            try:
                got = self.receive(1 << 20)
            except socket.timeout:
                continue
            except OSError:
                got = None
            if got is None:
                with self.cv:
                    self.closed = True
                    self.cv.notify_all()
                return
            if got:
                with self.cv:
                    for op, p in got:
                        self._frame(op, p)
                    self.cv.notify_all()

    def _frame(self, op: int, p: bytes) -> None:
        self.frames.append((op, time.monotonic()))
        if op == U.OP_MESSAGE:
            self.messages[U.get_u32(p, 0)].append(p[4:])
        elif op == U.OP_ERROR:
            e = json.loads(p)
            e["_t"] = time.monotonic()            # arrival time, for rate checks
            self.errors.append(e)
        elif op == U.OP_SUB_COUNT:
            self.counts.append(json.loads(p)["counts"])
        elif op == U.OP_PONG:
            self.pongs += 1
        elif op == U.OP_HELLO_ACK:
            self.hello_ack = json.loads(p)

    def wait(self, pred: Callable[[], Any], timeout: float = 5.0) -> Any:
        end = time.monotonic() + timeout
        with self.cv:
            while True:
                v = pred()
                left = end - time.monotonic()
                if v or left <= 0:
                    return v
                self.cv.wait(min(left, 0.1))

    def error_codes(self) -> List[tuple]:
        with self.cv:
            return [(e["code"], e["id"]) for e in self.errors]

    def settle(self, id_: int, topic: str, rtype: str = "std_msgs/msg/String",
               timeout: float = 10.0) -> None:
        """The event a negative check waits on (instead of a sleep): ADVERTISE a fresh publisher
        `id_` on `topic` and wait for its first SUB_COUNT. The ROS side handles this client's
        registrations and PUBLISHes in order and reports a publisher's count only once it has
        created it, so every ERROR (or message) caused by what was sent before has arrived."""
        self.advertise(id_, topic, rtype)
        assert self.wait(lambda: self.count_of(id_) is not None
                         or any(e["id"] == id_ for e in self.errors), timeout), \
            "no SUB_COUNT for the marker %d on %s" % (id_, topic)
        assert self.count_of(id_) is not None, self.errors

    def count_of(self, id_: int) -> Optional[int]:
        """The last SUB_COUNT reported for publisher id ``id_`` (None: not reported yet)."""
        with self.cv:
            for c in reversed(self.counts):
                if str(id_) in c:
                    return c[str(id_)]
        return None

    def close(self) -> None:
        self.running = False
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.t.join(5)
        self.sock.close()


# -- messages and DDS ----------------------------------------------------------------------------
def store() -> Any:
    from rosbags.typesys import Stores, get_typestore
    global _STORE
    if _STORE is None:
        _STORE = get_typestore(Stores.ROS2_HUMBLE)
    return _STORE


_STORE: Any = None


def ser(msg: Any, rtype: str) -> bytes:
    return bytes(store().serialize_cdr(msg, rtype))


def deser(data: bytes, rtype: str) -> Any:
    return store().deserialize_cdr(data, rtype)


def dds_qos(reliable: bool = True, transient_local: bool = False, depth: int = 10) -> Any:
    from cyclonedds.qos import Policy, Qos
    return Qos(Policy.Reliability.Reliable(10 ** 9) if reliable else Policy.Reliability.BestEffort,
               Policy.Durability.TransientLocal if transient_local else Policy.Durability.Volatile,
               Policy.History.KeepLast(depth))


def take_raw(reader: Any) -> List[bytes]:
    """Serialized samples (4-byte encapsulation header included) a reader holds, taken."""
    from cyclonedds._clayer import ddspy_take
    got = ddspy_take(reader._ref, 0xFFFF, 64)
    if isinstance(got, int):
        return []
    return [d for d, info in got if info.valid_data]


class RawCollector:
    """Takes raw samples from a DDS reader in the test thread, keeping them in order."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader
        self.got: List[bytes] = []

    def poll(self) -> List[bytes]:
        self.got += take_raw(self.reader)
        return self.got

    def wait(self, n: int, timeout: float = 10.0) -> List[bytes]:
        wait_for(lambda: len(self.poll()) >= n, timeout)
        return self.got


# -- test messages -------------------------------------------------------------------------------
def _T(name: str) -> Any:
    return store().types[name]


def header(frame: str = "f", sec: int = 1, nanosec: int = 2) -> Any:
    return _T("std_msgs/msg/Header")(stamp=_T("builtin_interfaces/msg/Time")(sec=sec,
                                                                           nanosec=nanosec),
                                     frame_id=frame)


def string_msg(text: str) -> Any:
    return _T("std_msgs/msg/String")(data=text)


def twist(x: float = 0.5, z: float = -1.25) -> Any:
    V = _T("geometry_msgs/msg/Vector3")
    return _T("geometry_msgs/msg/Twist")(linear=V(x=x, y=0.0, z=0.0), angular=V(x=0.0, y=0.0, z=z))


def image(n: int, frame: str = "cam") -> Any:
    import numpy as np
    return _T("sensor_msgs/msg/Image")(header=header(frame), height=1, width=n, encoding="mono8",
                                       is_bigendian=0, step=n,
                                       data=(np.arange(n) % 251).astype(np.uint8))


def tf_msg(child: str = "base", x: float = 1.0) -> Any:
    G = "geometry_msgs/msg/"
    ts = _T(G + "TransformStamped")(
        header=header("world"), child_frame_id=child,
        transform=_T(G + "Transform")(translation=_T(G + "Vector3")(x=x, y=2.0, z=3.0),
                                      rotation=_T(G + "Quaternion")(x=0.0, y=0.0, z=0.0, w=1.0)))
    return _T("tf2_msgs/msg/TFMessage")(transforms=[ts])


def aligned(make: Callable[[int], Any], rtype: str, start: int = 0) -> tuple:
    """(message, CDR bytes) for the first k >= start whose CDR length is a multiple of 4."""
    for k in range(start, start + 8):
        msg = make(k)
        data = ser(msg, rtype)
        if len(data) % 4 == 0:
            return msg, data
    raise AssertionError("no 4-aligned variant of " + rtype)


class Dds:
    """Entities of the independent participant for one test; deleted at its end, so a reader of
    one test does not count as a subscriber in the next."""

    _topics: Dict[tuple, Any] = {}      # one Topic per (participant, name) for the whole session

    def __init__(self, dp: Any) -> None:
        self.dp = dp
        self.entities: List[Any] = []

    def topic(self, name: str, cls: Any) -> Any:
        from cyclonedds.topic import Topic
        key = (id(self.dp), name)
        if key not in Dds._topics:
            Dds._topics[key] = Topic(self.dp, name, cls)
        return Dds._topics[key]

    def reader(self, name: str, cls: Any, **qos: Any) -> Any:
        from cyclonedds.sub import DataReader
        r = DataReader(self.dp, self.topic(name, cls), qos=dds_qos(**qos))
        self.entities.append(r)
        return r

    def writer(self, name: str, cls: Any, **qos: Any) -> Any:
        from cyclonedds.pub import DataWriter
        w = DataWriter(self.dp, self.topic(name, cls), qos=dds_qos(**qos))
        self.entities.append(w)
        return w

    def delete(self, e: Any) -> None:
        if e in self.entities:
            self.entities.remove(e)
            e.__del__()

    def close(self) -> None:
        for e in reversed(self.entities):
            e.__del__()
        self.entities = []


def matched(entity: Any) -> int:
    """Current matched count of a DDS reader or writer."""
    from cyclonedds.pub import DataWriter
    if isinstance(entity, DataWriter):
        return int(entity.get_publication_matched_status().current_count)
    return int(entity.get_subscription_matched_status().current_count)


def both_matched(client: Any, id_: int, reader: Any) -> bool:
    """The test's DDS reader and the bridge's writer for publisher ``id_`` of ``client`` have
    matched each other: the reader says so, and the writer's side through the SUB_COUNT the
    client got. A volatile writer hands a reader nothing it wrote before *it* matched that
    reader, and the reader's side can be the first to know: a loaded run lost all three samples
    of test_unaligned_message_gets_zero_padding[serial] after the reader alone had matched."""
    return matched(reader) >= 1 and (client.count_of(id_) or 0) >= 1


def alive_endpoints(builtin_reader: Any, topic: str) -> set:
    """Keys of the endpoints on DDS topic ``topic`` that a DCPSPublication / DCPSSubscription
    reader sees alive (a deleted endpoint's instance is no longer alive)."""
    from cyclonedds.core import InstanceState
    return {s.key for s in builtin_reader.read(10000)
            if s.topic_name == topic and s.sample_info.instance_state == InstanceState.Alive}


def both_ways(bridge: Any, connect: Callable[..., Any], dds: Dds, out: str,
              back: str) -> tuple:
    """String traffic both ways through `bridge`: client a publishes `out` (id 1) to a DDS reader
    (depth 100), a DDS writer writes `back` to client b (id 2); returns (raw, w, a, b) once the
    bridge's writer and reader have matched the test's. `raw` is a RawCollector."""
    from tests.support import ros_idl as I
    S = "std_msgs/msg/String"
    raw = RawCollector(dds.reader("rt" + out, I.String, depth=100))
    w = dds.writer("rt" + back, I.String, depth=100)
    a, b = connect(bridge, "pub"), connect(bridge, "sub")
    a.advertise(1, out, S)
    b.subscribe(2, back, S)
    assert wait_for(lambda: both_matched(a, 1, raw.reader) and matched(w) == 1, 10)
    return raw, w, a, b

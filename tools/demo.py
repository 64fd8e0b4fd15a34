"""make demo: the whole chain on this machine, no ROS installation needed.

    Unreal stand-in                gateway                        companion                ROS side
    ubrb_client sim  ──TCP──▶  ubrb_min.py (CPython) ══UDP link══▶  ros_side --backend dds ──DDS──▶ observer
    (/clock /tf /odom …)                                                                        (this process)
                     ◀─────────────────────────── /cmd_vel ◀────────────────────────────────────────

Starts the gateway, the companion and the simulated robot as child processes (logs in a temp
directory), and a ROS-side observer in this process: a plain cyclonedds participant that drives
/cmd_vel (a slow circle, paused 2 s every 5 s) and prints a table once a second: per topic rate,
bytes/s and message count, the robot's pose from /odom, and the drop counters from the
companion's /diagnostics. Ctrl-C stops everything (SIGINT to every child, then wait) and exits 0;
if a child dies, the demo says which, shows the end of its log, stops the rest and exits 1.

Everything stays on this machine: the gateway and the link bind 127.0.0.1, and every DDS
participant (companion and observer) gets the loopback-only Cyclone configuration
(CYCLONEDDS_URI, from shared/design/ROS-NOTES.md).

    python tools/demo.py [--duration S] [--ports GW[,LINK]] [--domain N] [--no-color]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Any, Callable, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (ROOT, os.path.join(ROOT, "ports", "cpython")):  # the repo, the shared runtime
    if _path not in sys.path:
        sys.path.insert(0, _path)

from ubrb_host import cli as host_cli  # noqa: E402

try:
    from tools import ros_observer as obs  # noqa: E402
except ImportError as _missing:  # cyclonedds/rosbags: main() says so in one line
    obs = None  # type: ignore[assignment]
    OBSERVER_MISSING: Optional[ImportError] = _missing
else:
    OBSERVER_MISSING = None

HOST = "127.0.0.1"
DEFAULT_PORTS = (8268, 8269)
STOP_GRACE_S = 5.0      # after SIGINT, before SIGKILL
TIMEOUTS = {"gateway": 15.0, "companion": 20.0, "link": 15.0, "sim": 15.0, "discovery": 20.0}


class Stop(Exception):
    """Ctrl-C (or SIGTERM/SIGHUP) during start-up."""


class Failed(Exception):
    """A start-up step failed or a child died; the message says which and why."""


# ------------------------------------------------------------------------------------ ports
def _free(kind: int, port: int) -> bool:
    s = socket.socket(socket.AF_INET, kind)
    try:
        if kind == socket.SOCK_STREAM:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the gateway does
        s.bind((HOST, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def ephemeral(kind: int) -> int:
    s = socket.socket(socket.AF_INET, kind)
    try:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])
    finally:
        s.close()


def choose_ports(spec: Optional[str]) -> Tuple[int, int, str]:
    """(gateway TCP port, link UDP port, note). ``spec``: None (8268,8269, or free ports if
    those are taken), ``0`` (free ports), ``GW`` (link GW+1) or ``GW,LINK`` (0 = free)."""
    note = ""
    if spec is None:
        gw, link = DEFAULT_PORTS
        if _free(socket.SOCK_STREAM, gw) and _free(socket.SOCK_DGRAM, link):
            return gw, link, note
        note = "%d/%d are in use; using free ports instead" % DEFAULT_PORTS
        spec = "0"
    parts = [p.strip() for p in spec.split(",")]
    if not 1 <= len(parts) <= 2 or not all(p.isdigit() for p in parts):
        raise host_cli.Fatal("--ports expects GW[,LINK] (0 = any free port), got %r" % spec,
                             host_cli.EXIT_USAGE)
    for p in parts:
        if int(p) > 65535:
            raise host_cli.Fatal("--ports: port must be 0-65535, got %s" % p, host_cli.EXIT_USAGE)
    gw = int(parts[0])
    link = int(parts[1]) if len(parts) == 2 else (gw + 1 if gw else 0)
    if link > 65535:
        raise host_cli.Fatal("--ports %d: the link would use %d; give both, GW,LINK" % (gw, link),
                             host_cli.EXIT_USAGE)
    gw = gw or ephemeral(socket.SOCK_STREAM)
    link = link or ephemeral(socket.SOCK_DGRAM)
    for kind, port, what in ((socket.SOCK_STREAM, gw, "TCP"), (socket.SOCK_DGRAM, link, "UDP")):
        if not _free(kind, port):
            raise host_cli.Fatal("%s port %s:%d is in use (try --ports 0)" % (what, HOST, port))
    return gw, link, note


# -------------------------------------------------------------------------------- children
def _parent_death_signal() -> Optional[Callable[[], None]]:
    """A preexec_fn that makes Linux send SIGTERM to the child if this process dies (even by
    SIGKILL), so no child outlives the demo. None where prctl is not available."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


class Child:
    def __init__(self, name: str, argv: List[str], log_path: str, env: Dict[str, str]) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self._log: IO[bytes] = open(log_path, "wb")
        # Own session: the terminal's Ctrl-C reaches only the demo, which stops the children
        # itself, in order. Its pid is also its process group id.
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True,
                                     preexec_fn=_parent_death_signal())
        self.pid = self.proc.pid
        self._pos = 0
        self._text = ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        """Everything logged so far (read incrementally)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._pos)
                chunk = f.read()
        except OSError:
            return self._text
        self._pos += len(chunk)
        self._text += chunk.decode("utf-8", "replace")
        return self._text

    def tail(self, n: int = 12) -> List[str]:
        return self.log_text().rstrip("\n").splitlines()[-n:]

    def signal(self, sig: int) -> None:
        if self.alive():
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, grace: float = STOP_GRACE_S) -> Optional[int]:
        """SIGINT, wait up to ``grace`` s, then SIGKILL. Returns the exit code."""
        self.signal(signal.SIGINT)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(5)
        self._log.close()
        return self.proc.returncode


# ------------------------------------------------------------------------------------ demo
class SafeOut:
    """stdout that cannot break the clean-up: once the reader has gone (``demo | head``),
    output goes to /dev/null and the demo still stops its children in order."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out

    def _lost(self) -> None:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.out.fileno())  # also for the interpreter's flush at exit
            os.close(devnull)
        except (OSError, ValueError):
            pass

    def write(self, text: str) -> None:
        try:
            self.out.write(text)
        except OSError:
            self._lost()

    def flush(self) -> None:
        try:
            self.out.flush()
        except OSError:
            self._lost()


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.color = args.color
        self.style = obs.Style(self.color)
        self.out = SafeOut(sys.stdout)
        self.children: List[Child] = []
        self.observer: Optional[obs.Observer] = None
        self.stop_ev = threading.Event()
        self.signal_name = ""
        self.env = dict(os.environ)
        self.env["CYCLONEDDS_URI"] = obs.LOOPBACK_XML
        self.env["PYTHONUNBUFFERED"] = "1"
        self.env.pop("ROS_DOMAIN_ID", None)  # the companion gets --domain
        self.t_start = time.monotonic()
        self.timings: Dict[str, float] = {}

    # -- output ---------------------------------------------------------------------------------
    def say(self, text: str, end: str = "\n") -> None:
        self.out.write(text + end)
        self.out.flush()

    def step(self, what: str) -> float:
        self.say(what + "... ", end="")
        return time.monotonic()

    def ok(self, t0: float, key: str, detail: str = "") -> None:
        dt = time.monotonic() - t0
        self.timings[key] = dt
        self.say(self.style.green("ok") + " (%s%.1f s)" % (detail + ", " if detail else "", dt))

    # -- signals --------------------------------------------------------------------------------
    def on_signal(self, signum: int, _frame: Any) -> None:
        self.signal_name = signal.Signals(signum).name
        host_cli.set_on_signal(self.stop_ev)()

    def check(self) -> None:
        """Raise Stop on Ctrl-C, Failed if a child has died."""
        if self.stop_ev.is_set():
            raise Stop()
        for c in self.children:
            code = c.proc.poll()
            if code is not None:
                raise Failed("%s (pid %d) died: %s" % (c.name, c.pid, exit_desc(code)), c)

    def wait_for(self, what: str, cond: Callable[[], bool], timeout: float,
                 child: Optional[Child] = None) -> None:
        end = time.monotonic() + timeout
        while True:
            self.check()
            if cond():
                return
            if time.monotonic() >= end:
                raise Failed("%s: nothing after %.0f s" % (what, timeout), child)
            self.stop_ev.wait(0.05)

    def wait_log(self, child: Child, pattern: str, what: str, timeout: float) -> "re.Match[str]":
        rx = re.compile(pattern)
        found: List["re.Match[str]"] = []

        def cond() -> bool:
            m = rx.search(child.log_text())
            if m:
                found.append(m)
            return bool(m)

        self.wait_for(what, cond, timeout, child)
        return found[0]

    def spawn(self, name: str, argv: List[str]) -> Child:
        c = Child(name, argv, os.path.join(self.log_dir, name + ".log"), self.env)
        self.children.append(c)
        return c

    # -- the run --------------------------------------------------------------------------------
    def run(self) -> int:
        a = self.args
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self.on_signal)
        self.own_log_dir = not a.log_dir  # a temp dir of our own goes away after a clean run
        self.log_dir = a.log_dir or tempfile.mkdtemp(prefix="ubrb-demo-")
        os.makedirs(self.log_dir, exist_ok=True)
        code = 0
        try:
            self.start()
            code = self.watch()
        except Stop:
            self.say("")
            self.say("%s: stopping" % (self.signal_name or "stop"))
        except Failed as e:
            self.say("")
            self.fail(str(e.args[0]), e.args[1] if len(e.args) > 1 else None)
            code = 1
        finally:
            code = self.shutdown(code)
        return code

    def fail(self, msg: str, child: Optional[Child]) -> None:
        self.say(self.style.red("FAILED: " + msg))
        if child is not None:
            self.say("last lines of %s:" % child.log_path)
            for line in child.tail():
                self.say("  | " + line)

    def start(self) -> None:
        a = self.args
        py = sys.executable
        s = self.style
        self.say(s.bold("UBRB demo") + ": gateway, companion (dds), simulated robot, ROS-side "
                 "observer")
        if a.ports_note:
            self.say("ports    " + a.ports_note)
        self.say("gateway  %s:%d (TCP, for UBRB clients), link udp://%s:%d"
                 % (HOST, a.gw_port, HOST, a.link_port))
        self.say("logs     %s/{gateway,companion,sim}.log" % self.log_dir)

        t0 = self.step("DDS domain (loopback only)")
        if a.domain is None:
            a.domain = domain = pick_domain()
            self.ok(t0, "domain", "%d: random, unused; ROS_DOMAIN_ID or --domain sets it"
                    % domain)
        else:
            n = other_participants(a.domain)
            self.ok(t0, "domain", "%d from %s" % (a.domain, a.domain_why))
            if n:
                self.say(s.yellow("note: %d other DDS participant(s) on domain %d on this "
                                  "machine; their topics may mix with the demo's" % (n, a.domain)))

        t0 = self.step("starting gateway")
        gw = self.spawn("gateway", [py, "ubrb_min.py", "--listen", "%s:%d" % (HOST, a.gw_port),
                                    "--link", "udp://%s:%d" % (HOST, a.link_port)]
                        + a.child_log)
        self.wait_log(gw, r"listening on", "gateway start-up", TIMEOUTS["gateway"])
        self.ok(t0, "gateway", "pid %d" % gw.pid)

        t0 = self.step("starting companion (dds backend)")
        comp = self.spawn("companion", [py, "-m", "ros_side", "--link",
                                        "udp://%s:%d" % (HOST, a.link_port), "--backend", "dds",
                                        "--domain", str(a.domain)] + a.child_log)
        self.wait_log(comp, r"companion on link", "companion start-up", TIMEOUTS["companion"])
        self.ok(t0, "companion", "pid %d" % comp.pid)

        t0 = self.step("waiting for the companion link")
        m = self.wait_log(gw, r"ROS side up \('(\w+)'", "link to the companion", TIMEOUTS["link"])
        self.ok(t0, "link", "ROS 2 %s" % m.group(1))

        t0 = self.step("starting simulated robot (ubrb_client sim)")
        sim = self.spawn("sim", [py, "-m", "ubrb_client", "sim", "--server",
                                 "%s:%d" % (HOST, a.gw_port)])
        self.wait_log(gw, r"says HELLO: 'ubrb_sim'", "the sim connecting to the gateway",
                      TIMEOUTS["sim"])
        self.ok(t0, "sim", "pid %d, connected" % sim.pid)

        t0 = self.step("starting ROS-side observer")
        self.observer = obs.Observer(int(a.domain))
        self.ok(t0, "observer")

        t0 = self.step("DDS discovery (robot topics and /cmd_vel)")
        observer = self.observer

        def discovered() -> bool:
            return not observer.seen(obs.ROBOT_TOPICS) and observer.cmd_matched() > 0

        try:
            self.wait_for("DDS discovery", discovered, TIMEOUTS["discovery"])
        except Failed:
            missing = observer.seen(obs.ROBOT_TOPICS)
            raise Failed("DDS discovery: no data on %s%s after %.0f s"
                         % (", ".join(missing) or "-",
                            "" if observer.cmd_matched() else "; nobody reads /cmd_vel",
                            TIMEOUTS["discovery"]), comp)
        self.ok(t0, "discovery")
        self.timings["startup"] = time.monotonic() - self.t_start
        self.say("up in %.1f s. /cmd_vel: %.1f m/s, %.1f rad/s at %.0f Hz, %.0f s on, %.0f s "
                 "off. Ctrl-C stops." % (self.timings["startup"], obs.DRIVE_V, obs.DRIVE_W,
                                         obs.DRIVE_HZ, obs.DRIVE_S, obs.PAUSE_S))
        observer.snapshot()  # rates of the first table: from now on
        observer.start_driving()

    def watch(self) -> int:
        a = self.args
        assert self.observer is not None
        observer = self.observer
        table = obs.LiveTable(self.out, self.color)
        self.say("")
        t_drive = time.monotonic()
        end = t_drive + a.duration if a.duration else None
        next_t = t_drive + 1.0
        while True:
            if self.stop_ev.wait(max(0.0, next_t - time.monotonic())):
                self.say("")
                self.say("%s: stopping" % (self.signal_name or "stop"))
                return 0
            next_t += 1.0
            self.check()  # a dead child raises Failed
            snap = observer.snapshot()
            title = "UBRB demo %s   gateway %s:%d   DDS domain %d   %s" % (
                _clock(time.monotonic() - t_drive), HOST, a.gw_port, a.domain,
                "(Ctrl-C to stop)" if end is None else "(%.0f s left)"
                % max(0.0, end - time.monotonic()))
            table.show(obs.render(snap, self.style, title))
            if end is not None and time.monotonic() >= end - 0.05:
                return 0

    def summary(self) -> None:
        if self.observer is None or "discovery" not in self.timings:
            return
        o = self.observer
        snap = o.snapshot(whole_run=True)
        self.say("")
        for line in obs.render(snap, self.style, "summary (averages over the run)",
                               whole_run=True):
            self.say(line)
        p0, p1 = o.start_pose, snap.pose
        if p0 is not None and p1 is not None:
            dist = ((p1.x - p0.x) ** 2 + (p1.y - p0.y) ** 2) ** 0.5
            self.say("robot under /cmd_vel: travelled %.2f m, now %.2f m from where it "
                     "started," % (o.travelled, dist))
            self.say("  from x %+.2f y %+.2f to x %+.2f y %+.2f, heading %+.1f deg"
                     % (p0.x, p0.y, p1.x, p1.y, _deg(p1.yaw - p0.yaw)))
        if "startup" in self.timings:  # the steps' times are on the progress lines
            self.say("start-up took %.1f s" % self.timings["startup"])

    def shutdown(self, code: int) -> int:
        """Stop in order (robot, observer, companion, gateway); report children that failed."""
        # Ctrl-C again while stopping must not abort the clean-up half-way.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        dead_before = {c.name: c.proc.poll() for c in self.children}
        try:
            if self.observer is not None and code == 0:
                self.summary()
        except Exception as e:  # the summary must never block the clean-up
            self.say("summary failed: %s" % e)
        self.say("stopping: ", end="")
        t0 = time.monotonic()
        by_name = {c.name: c for c in self.children}
        parts = []
        for name in ("sim", "observer", "companion", "gateway"):
            if name == "observer":
                if self.observer is not None:
                    self.observer.close()
                    parts.append("observer ok")
                continue
            c = by_name.get(name)
            if c is None:
                continue
            rc = c.stop()
            if dead_before[name] is not None:
                parts.append("%s had died (%s)" % (name, exit_desc(dead_before[name])))
            elif rc in (0, -signal.SIGINT):
                parts.append("%s ok" % name)
            else:
                parts.append("%s: %s" % (name, exit_desc(rc)))
                if code == 0:
                    code = 1
                    self.fail("%s: %s while stopping" % (name, exit_desc(rc)), c)
        self.say("%s (%.1f s)" % (", ".join(parts), time.monotonic() - t0))
        if code == 0 and self.own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)  # nothing to read: leave nothing
        else:
            self.say("logs kept in %s" % self.log_dir)
        return code


def pick_domain(tries: int = 10) -> int:
    """A random DDS domain 1..200 that no participant on this machine uses (the last one tried
    if all are taken)."""
    domain = 0
    for _ in range(tries):
        domain = random.randint(1, 200)
        if not other_participants(domain):
            break
    return domain


def other_participants(domain: int, wait: float = 0.3) -> int:
    """DDS participants already on ``domain`` (loopback: on this machine). A throwaway
    participant listens for ``wait`` s (discovery over loopback takes a few ms) and is deleted,
    so no DDS thread is left running when the children are forked."""
    from cyclonedds.builtin import BuiltinDataReader, BuiltinTopicDcpsParticipant
    from cyclonedds.domain import DomainParticipant

    dp = DomainParticipant(domain)
    keys: set = set()
    try:
        r = BuiltinDataReader(dp, BuiltinTopicDcpsParticipant)
        end = time.monotonic() + wait
        while time.monotonic() < end and len(keys) < 2:
            for sample in r.take(N=64):
                keys.add(sample.key)
            time.sleep(0.02)
    finally:
        dp.__del__()  # cyclonedds deletes entities on garbage collection otherwise
    return max(0, len(keys) - 1)  # our own participant is in the list too


def exit_desc(code: Optional[int]) -> str:
    if code is not None and code < 0:
        try:
            return "killed by %s" % signal.Signals(-code).name
        except ValueError:
            pass
    return "exit code %s" % code


def _clock(t: float) -> str:
    return "%02d:%02d" % divmod(int(t), 60)


def _deg(rad: float) -> float:
    import math

    d = math.degrees(rad)
    return (d + 180.0) % 360.0 - 180.0


def build_parser() -> argparse.ArgumentParser:
    p = host_cli.Parser(prog="tools/demo.py", description=(__doc__ or "").split("\n\n")[0],
                                epilog="Without --domain the demo uses ROS_DOMAIN_ID if it is set, "
                                       "else a random domain 1..200 that no other DDS "
                                       "participant on this machine uses (printed at start-up). "
                                       "All DDS traffic stays on loopback.")
    p.add_argument("--duration", type=host_cli.duration, default=None, metavar="S",
                   help="run S seconds after start-up, then stop (default: until Ctrl-C)")
    p.add_argument("--ports", default=None, metavar="GW[,LINK]",
                   help="gateway TCP port and link UDP port on 127.0.0.1 (default 8268,8269, or "
                        "free ports if those are taken; 0 = any free port)")
    p.add_argument("--domain", type=host_cli.domain_id, default=None, metavar="N",
                   help="DDS domain id 0-232 (default: ROS_DOMAIN_ID if set, else a random "
                        "unused one)")
    p.add_argument("--no-color", action="store_true",
                   help="plain output (also when stdout is not a terminal, or NO_COLOR is set)")
    p.add_argument("--log-dir", default=None, metavar="DIR",
                   help="where the children's logs go (default: a temp directory, removed "
                        "after a clean run, kept when something failed)")
    import ubrb_min

    host_cli.add_program_arguments(p, ubrb_min.VERSION)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    """The demo: one line and exit 2 for a usage mistake, 1 when the chain did not come up."""
    return host_cli.run_program("tools/demo.py", run, argv)


def run(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if OBSERVER_MISSING is not None:
        raise OBSERVER_MISSING  # the one-line "pip install '.[dds]'" of run_program
    args.color = not args.no_color and sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    level = host_cli.log_level_of(args)
    host_cli.setup_logging(level)
    # the children's logs (files) keep their start-up lines: only -v / debug reaches them
    args.child_log = ["--log-level", "debug"] if level == "debug" else []
    args.gw_port, args.link_port, args.ports_note = choose_ports(args.ports)
    if args.domain is not None:
        args.domain_why = "--domain"
    elif host_cli.env_domain() is not None:
        args.domain = host_cli.env_domain()
        args.domain_why = "ROS_DOMAIN_ID"
    else:
        args.domain_why = "random"  # chosen at start-up among the unused ones
    obs.use_loopback(force=True)  # this process's participant too, before any DDS entity exists
    return Demo(args).run()


if __name__ == "__main__":
    sys.exit(main())

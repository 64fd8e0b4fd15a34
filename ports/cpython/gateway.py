"""The CPython port of the gateway: TCP server for UBRB clients + the link to the companion.

`python ubrb_min.py --listen 127.0.0.1:8268 --link udp://127.0.0.1:8269` lands here. Everything
protocol-shaped lives in ubrb_min (sans-IO); this module only moves bytes and keeps time.
"""

from __future__ import annotations

import argparse
import logging
import mmap
import selectors
import signal
import socket
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import ubrb_min as core

log = logging.getLogger("ubrb.gateway")

DEFAULT_LISTEN = "0.0.0.0:8268"
DEFAULT_LINK = "udp://127.0.0.1:8269"

LIMIT_HELP = {
    "max_clients": "UBRB client connections served at once",
    "max_pubs": "publisher ids per client",
    "max_subs": "subscription ids per client",
    "max_topics": "topic slots (each for publishers and again for subscriptions)",
    "max_payload": "largest PUBLISH/MESSAGE payload in bytes",
    "max_control": "largest payload of any other op in bytes",
    "queue_bytes": "send queue per client in bytes",
    "control_reserve": "bytes of each send queue only control frames may use",
}


def mapped_buffer(n: int) -> Any:
    # Anonymous mappings are zero pages until written: the `pc` profile's 16 x 192 MiB of
    # buffers are reserved at start-up (static bounds) but only touched pages cost RAM.
    return mmap.mmap(-1, n) if n >= 1 << 20 else bytearray(n)


core.new_buffer = mapped_buffer


ACCEPT_GRACE_MS = 2000  # at start-up, how long clients may wait for the link before being served


def now_ms() -> int:
    return int(time.monotonic() * 1000)


def parse_hostport(text: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = default_host, text
    host = host.strip("[]") or default_host
    try:
        return host, int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}") from None


def profiles_help() -> str:
    lines = ["profiles (every limit can be overridden by its own flag):"]
    for name, p in core.PROFILES.items():
        vals = ", ".join(f"{k}={p[k]}" for k in core.PROFILE_KEYS)
        lines.append(f"  {name}: {vals}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="ubrb_min.py",
        description=(
            "UBRB v1 gateway: serves Unreal Engine uBotROS clients over TCP and relays their "
            "topics to the ROS 2 companion (python -m ros_side) over a UDP or serial link."
        ),
        epilog=profiles_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"TCP address for UBRB clients (default {DEFAULT_LISTEN})",
    )
    ap.add_argument(
        "--link",
        default=DEFAULT_LINK,
        metavar="URL",
        help=(
            "the link to the companion: udp://HOST:PORT (the companion's address) or "
            "serial:PATH (PATH may be any pyserial URL, e.g. socket://host:port); "
            f"'none' runs without a ROS side (default {DEFAULT_LINK})"
        ),
    )
    ap.add_argument("--baud", type=int, default=115200, help="serial baud rate (default 115200)")
    ap.add_argument(
        "--link-mtu",
        type=int,
        default=1400,
        metavar="BYTES",
        help="largest UDP datagram on the link (default 1400)",
    )
    ap.add_argument(
        "--profile",
        default="pi",
        choices=sorted(core.PROFILES),
        help="static limits to start from (default pi; see below)",
    )
    for key, text in LIMIT_HELP.items():
        ap.add_argument(
            "--" + key.replace("_", "-"), type=int, default=None, metavar="N", help=text
        )
    ap.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="logging threshold (default info)",
    )
    return ap


class GatewayServer:
    """Selectors loop: a listening socket, client sockets, and optionally a link driver."""

    def __init__(
        self,
        gw: core.Gateway,
        listen: tuple[str, int],
        link: Any = None,
        accept_grace_ms: int = ACCEPT_GRACE_MS,
    ) -> None:
        self.gw = gw
        self.link = link  # object with fileno(), on_readable(now), wants_write(), flush(now), tick(now)
        self.sel = selectors.DefaultSelector()
        self.lsock = socket.socket(socket.AF_INET6 if ":" in listen[0] else socket.AF_INET)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(listen)
        self.lsock.listen(16)
        self.lsock.setblocking(False)
        self.address = self.lsock.getsockname()[:2]
        # Connections are accepted once the ROS side is up, or after a grace period: a client
        # that reconnects to a restarted gateway replays its queued reliable messages at once,
        # and those would be dropped if they beat the link handshake. Until then the kernel's
        # backlog holds the connections and their bytes.
        self.accepting = False
        self.accept_at = now_ms() + (accept_grace_ms if link is not None else 0)
        self.socks: List[Optional[socket.socket]] = [None] * len(gw.clients)
        self.running = True
        self.link_fd = -1
        if link is not None:
            self._sync_link_fd()  # fileno() is -1 while a serial device is absent

    def stop(self, *_: Any) -> None:
        self.running = False

    def serve(self, until: Optional[Callable[[], bool]] = None) -> None:
        while self.running and not (until and until()):
            self.step()
        self.close()

    def step(self) -> None:
        now = now_ms()
        if not self.accepting and (self.gw.ros_ready or now >= self.accept_at):
            self.accepting = True
            self.sel.register(self.lsock, selectors.EVENT_READ, ("listen", -1))
        timeout = self.gw.next_deadline(now) / 1000.0
        timeout = min(timeout, 0.05)
        for key, events in self.sel.select(timeout):
            kind, ci = key.data
            now = now_ms()
            if kind == "listen":
                self._accept(now)
            elif kind == "link":
                self.link.on_readable(now)
            else:
                if events & selectors.EVENT_READ:
                    self._read(ci, now)
                if events & selectors.EVENT_WRITE and self.socks[ci] is not None:
                    self._write(ci)
        now = now_ms()
        self.gw.tick(now)
        if self.link is not None:
            self.link.tick(now)
            self._sync_link_fd()
            self.link.flush(now)
        for ci, s in enumerate(self.socks):
            if s is None:
                continue
            if self.gw.close_overdue(ci, now):
                self._drop(ci, self.gw.clients[ci].close_reason + " (last frames not read)")
                continue
            if self.gw.clients[ci].queue.pending():
                self._write(ci)
            if self.socks[ci] is not None:
                self._sync_client(ci)

    def _sync_link_fd(self) -> None:
        # A serial device may be re-opened under a new descriptor after an unplug.
        fd = self.link.fileno()
        if fd != self.link_fd:
            if self.link_fd >= 0:
                try:
                    self.sel.unregister(self.link_fd)
                except (KeyError, ValueError):
                    pass
            if fd >= 0:
                self.sel.register(fd, selectors.EVENT_READ, ("link", -1))
            self.link_fd = fd

    def _accept(self, now: int) -> None:
        while True:
            try:
                sock, addr = self.lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            ci = self.gw.accept(now)
            if ci < 0:
                log.warning("refusing %s: too many clients", addr)
                try:
                    sock.send(self.gw.reject_frame())
                except OSError:
                    pass
                sock.close()
                continue
            log.info("client %d connected from %s", ci, addr)
            self.socks[ci] = sock
            self.sel.register(sock, selectors.EVENT_READ, ("client", ci))

    def _read(self, ci: int, now: int) -> None:
        sock = self.socks[ci]
        if sock is None:
            return
        dec = self.gw.clients[ci].decoder
        total = 0
        # Bounded reads per wake-up so one busy client cannot starve the others.
        for _ in range(16):
            if dec.space() == 0:
                break
            try:
                n = sock.recv_into(memoryview(dec.buf)[dec.fill :], dec.space())
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                self._drop(ci, f"read error: {e}")
                return
            if n == 0:
                self.gw.received(ci, 0, now)
                self._drop(ci, "closed by client")
                return
            total += n
            self.gw.received(ci, n, now)
            if self.gw.wants_close(ci):
                break

    def _write(self, ci: int) -> None:
        sock = self.socks[ci]
        q = self.gw.clients[ci].queue
        while sock is not None and q.pending():
            try:
                n = sock.send(memoryview(q.buf)[q.head : q.tail])
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                self._drop(ci, f"write error: {e}")
                return
            q.sent(n)
        if not q.pending() and self.gw.wants_close(ci):
            self._drop(ci, self.gw.clients[ci].close_reason)

    def _sync_client(self, ci: int) -> None:
        sock = self.socks[ci]
        assert sock is not None
        events = selectors.EVENT_READ
        if self.gw.wants_close(ci):
            events = 0
        if self.gw.clients[ci].queue.pending():
            events |= selectors.EVENT_WRITE
        key = self.sel.get_key(sock)
        if events == 0:
            events = selectors.EVENT_WRITE  # still flushing before close
        if key.events != events:
            self.sel.modify(sock, events, key.data)

    def _drop(self, ci: int, reason: str) -> None:
        sock = self.socks[ci]
        if sock is None:
            return
        self.socks[ci] = None
        try:
            self.sel.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()
        self.gw.closed(ci, reason)

    def close(self) -> None:
        for ci, s in enumerate(self.socks):
            if s is not None:
                self._drop(ci, "gateway shutting down")
        if self.accepting:
            self.sel.unregister(self.lsock)
        self.lsock.close()
        if self.link is not None:
            self.link.close()
        self.sel.close()


def profile_from_args(args: argparse.Namespace) -> Dict[str, int]:
    overrides = {k: getattr(args, k) for k in core.PROFILE_KEYS}
    return core.make_profile(args.profile, overrides)


def load_profile(args: argparse.Namespace, prog: str) -> Optional[Dict[str, int]]:
    """The profile the flags ask for, with its memory budget logged; None (after saying why on
    stderr) if the limits do not fit together."""
    try:
        profile = profile_from_args(args)
    except ValueError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None
    for line in core.format_budget(args.profile, profile).splitlines():
        log.info(line)
    return profile


def make_logger() -> Callable[[str, str], None]:
    levels = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}

    def emit(level: str, msg: str) -> None:
        log.log(levels.get(level, logging.INFO), msg)

    return emit


def open_link(args: argparse.Namespace, profile: Dict[str, int]) -> tuple[Any, Any]:
    """(RosPort, driver) for --link; (None, None) for 'none'."""
    if args.link == "none":
        return None, None
    from ports.cpython import link_transport

    return link_transport.open_gateway_link(
        args.link, baud=args.baud, mtu=args.link_mtu, max_message=profile["max_payload"]
    )


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    profile = load_profile(args, "ubrb_min.py")
    if profile is None:
        return 2
    try:
        ros, link = open_link(args, profile)
    except (OSError, RuntimeError, ValueError) as e:
        print(f"ubrb_min.py: cannot open link {args.link}: {e}", file=sys.stderr)
        return 2
    if link is not None:
        link_bytes = sum(
            len(v) for v in vars(link.s).values() if isinstance(v, (bytearray, memoryview))
        )
        log.info("  link session buffers: %s", core.human_bytes(link_bytes))
    gw = core.Gateway(profile, ros=ros, log=make_logger())
    try:
        server = GatewayServer(gw, parse_hostport(args.listen), link=link)
    except OSError as e:
        print(f"ubrb_min.py: cannot listen on {args.listen}: {e}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGINT, server.stop)
    signal.signal(signal.SIGTERM, server.stop)
    log.info(
        "UBRB gateway %s listening on %s:%d, link %s",
        core.VERSION,
        server.address[0],
        server.address[1],
        args.link,
    )
    last_stats = [0]

    def report_stats() -> bool:
        # The companion publishes these on /diagnostics with its own and the link's counters.
        now = now_ms()
        if ros is not None and now - last_stats[0] >= 1000:
            last_stats[0] = now
            stats = gw.counters()
            stats.update({"link_" + k: v for k, v in link.counters().items()})
            ros.send_stats(stats)
        return False

    server.serve(report_stats)
    log.info("stopped; counters: %s", gw.counters())
    if link is not None:
        log.info("link counters: %s", link.counters())
    return 0

"""Loaded at start-up by every Python process whose PYTHONPATH starts with this directory
(tests.support.netguard.guarded_env): an audit hook sees the address of every connect(),
sendto(), sendmsg() and bind() the process makes (Python's sockets; DDS, in C, is confined by
its configuration: tests.support.dds), appends it (once per process) to the file UBRB_NETGUARD_LOG names, and
refuses (OSError ENETUNREACH) any that is not on loopback (127.0.0.0/8, ::1) or a local socket,
so a test of address parsing can prove that nothing left this machine, without root or a
network namespace. Another sitecustomize on the path behind this one still runs."""

import errno
import os
import sys

_LOG = os.environ.get("UBRB_NETGUARD_LOG", "")
_EVENTS = {"socket.connect": "connect", "socket.sendto": "sendto", "socket.sendmsg": "sendto",
           "socket.bind": "bind"}
_seen: set = set()


def _loopback(host):
    if host.startswith("::ffff:"):
        host = host[7:]
    return host.startswith("127.") or host in ("::1", "localhost")


def _hook(event, args):
    kind = _EVENTS.get(event)
    if kind is None:
        return
    addr = args[1] if len(args) > 1 else None
    if not isinstance(addr, tuple) or not addr or not isinstance(addr[0], str):
        return                            # AF_UNIX paths, netlink: local
    host, port = addr[0], addr[1] if len(addr) > 1 else 0
    # A bind to the wildcard takes no packet anywhere; a listener on it is what a test checks.
    ok = _loopback(host) or (kind == "bind" and host in ("", "0.0.0.0", "::"))
    if _LOG and (kind, host, port) not in _seen:  # each address once per process
        _seen.add((kind, host, port))
        with open(_LOG, "a") as f:
            f.write("%d %s %s %s %s\n" % (os.getpid(), kind, host, port,
                                          "ok" if ok else "REFUSED"))
    if not ok:
        raise OSError(errno.ENETUNREACH, "off loopback (%s %s:%s): refused by the test's guard"
                      % (kind, host, port))


sys.addaudithook(_hook)


def _chain():
    """Run the sitecustomize this one hides, if any (e.g. a distribution's)."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)


_chain()

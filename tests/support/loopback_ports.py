"""Free loopback ports for the tests that start real servers and processes on this machine."""

import socket


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port on 127.0.0.1 that nothing is bound to right now (TCP by default, or SOCK_DGRAM)."""
    s = socket.socket(socket.AF_INET, kind)
    try:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
    finally:
        s.close()

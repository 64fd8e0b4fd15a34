"""Subprocess helper: a UBRB client that never reads and floods the gateway with PUBLISH for ids
it never advertised and PING (issue 13's "UE editor paused in a breakpoint", at its worst).

usage: flood.py PORT SECONDS
Prints "flooding" once its HELLO is sent, then "closed after S s, N bytes" when the gateway
closed the connection or "done, N bytes" after SECONDS.
"""

import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.support import ubrb_frames as F  # noqa: E402


def main() -> None:
    port, seconds = int(sys.argv[1]), float(sys.argv[2])
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: fills at once
    s.connect(("127.0.0.1", port))
    s.sendall(F.hello("flood"))
    print("flooding", flush=True)
    # Unknown ids, a new one in every frame (no repeat suppression helps), and PINGs.
    chunk = b"".join(F.publish(1000 + i, bytes(8)) + F.ping() for i in range(2000))
    t0 = time.monotonic()
    sent = 0
    while time.monotonic() - t0 < seconds:
        try:
            s.sendall(chunk)
        except OSError:
            print("closed after %.1f s, %d bytes" % (time.monotonic() - t0, sent), flush=True)
            return
        sent += len(chunk)
    print("done, %d bytes" % sent, flush=True)


if __name__ == "__main__":
    main()

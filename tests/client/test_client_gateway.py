"""The client against the real gateway (`python ubrb_min.py --listen ... --link none`): handshake,
keep-alive and registrations need no ROS side. Skipped if ubrb_min.py is absent or does not start."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from ubrb_client import Client
from tests.support.loopback_ports import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GATEWAY = os.path.join(ROOT, "ubrb_min.py")

pytestmark = pytest.mark.skipif(not os.path.exists(GATEWAY), reason="ubrb_min.py not present")




def start_gateway(port):
    p = subprocess.Popen([sys.executable, GATEWAY, "--listen", f"127.0.0.1:{port}", "--link", "none"],
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if p.poll() is not None:
            pytest.skip(f"ubrb_min.py exited: {p.stderr.read().decode()[-500:]}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return p
        except OSError:
            time.sleep(0.05)
    p.kill()
    pytest.skip("ubrb_min.py did not start listening")


def stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGKILL)
        p.wait(5)


def cdr(i):
    return b"\x00\x01\x00\x00" + i.to_bytes(4, "little")


def test_against_real_gateway_handshake_and_restart():
    port = free_port()
    gw = start_gateway(port)
    c = Client("127.0.0.1", port, name="pytest", reconnect_interval=0.1)
    pub = c.advertise("/ubrb_test/a", "std_msgs/msg/String")
    be = c.advertise("/ubrb_test/b", "std_msgs/msg/String", "best_effort")
    c.subscribe("/ubrb_test/c", "std_msgs/msg/String", lambda m: None)
    try:
        c.start()
        assert c.wait_connected(5, ack=True)
        assert c.server_info["protocol"] == 1 and "server" in c.server_info
        assert pub.publish(cdr(1)) and be.publish(cdr(2))
        assert c.sync(5)                 # the gateway answered our PING after everything else
        stop(gw)                         # kill the gateway
        deadline = time.monotonic() + 5
        while c.connected and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not c.connected
        assert pub.publish(cdr(3))       # queued for the next session
        gw = start_gateway(port)
        assert c.wait_connected(5, ack=True)
        assert c.sync(5)
        st = c.stats
        assert st["connects"] == 2 and st["queued_bytes"] == 0
        # same ids re-registered on a fresh gateway: no duplicate_id / hello_required / protocol_error
        assert [e.code for e in c.errors if e.code in
                ("duplicate_id", "hello_required", "protocol_error")] == []
    finally:
        c.close()
        stop(gw)

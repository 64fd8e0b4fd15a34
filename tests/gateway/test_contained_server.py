"""The CPython gateway loop (ubrb_host.loop.GatewayServer) contains any unexpected exception per
event over real sockets: one error line (rate-limited), that client closed, the others served."""

from __future__ import annotations

import logging
import threading
from typing import Any

import ubrb_min as U
from scripted import ScriptedRos, profile
from ubrb_host.loop import GatewayServer
from tests.support.qos import QOS_R
from tests.support.raw_client import RawClient
from tests.support.ubrb_frames import advertise, hello, ping, publish


def test_an_exception_serving_one_client_closes_only_that_client(caplog: Any) -> None:
    ros = ScriptedRos()
    gw = U.Gateway(profile(), ros=ros)
    ros.up()

    def boom(*args: Any) -> None:
        raise KeyError("a bug somewhere below the loop")
    ros.publish = boom                         # type: ignore[method-assign]
    server = GatewayServer(gw, ("127.0.0.1", 0))
    t = threading.Thread(target=server.serve, daemon=True)
    t.start()
    try:
        with caplog.at_level(logging.WARNING, logger="ubrb.gateway"):
            a = RawClient(server.address[1])
            b = RawClient(server.address[1])
            a.send(hello("a") + advertise(1, "/chatter", "std_msgs/msg/String", QOS_R) + ping())
            b.send(hello("b"))
            a.expect(U.OP_HELLO_ACK)
            a.expect(U.OP_PONG)
            b.expect(U.OP_HELLO_ACK)
            a.send(publish(1, b"\x00\x01\x00\x00x") * 3)   # the first closes a
            a.expect_closed()
            for _ in range(3):
                b.send(ping())
                b.expect(U.OP_PONG)
            a.close()
            b.close()
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1, errors
        assert "unexpected error in serving client 0: KeyError" in errors[0]
        assert t.is_alive()
    finally:
        server.stop()
        t.join(5)

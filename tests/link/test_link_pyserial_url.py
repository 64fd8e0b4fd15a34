"""`--link serial:PATH` takes any pyserial URL: both ends over `socket://`, the way a serial
device server (ser2net, an ESP-Link bridge) exposes a UART on the network."""

from __future__ import annotations

import select
import socket
import threading
from typing import List

from tests.support.qos import QOS_R
from tests.link.helpers import CompanionEnd, GatewayEnd, World, payload, seqno


class DeviceServer:
    """Accepts two TCP connections and joins them, byte for byte, like two UARTs cross-wired."""

    def __init__(self) -> None:
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(2)
        self.port = self.lsock.getsockname()[1]
        self.conns: List[socket.socket] = []
        self.running = True
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while self.running and len(self.conns) < 2:
            r, _, _ = select.select([self.lsock], [], [], 0.05)
            if r:
                self.conns.append(self.lsock.accept()[0])
        while self.running:
            r, _, _ = select.select(self.conns, [], [], 0.05)
            for s in r:
                data = s.recv(65536)
                if not data:
                    return
                other = self.conns[1] if s is self.conns[0] else self.conns[0]
                other.sendall(data)

    def close(self) -> None:
        self.running = False
        self.thread.join(2)
        for s in self.conns + [self.lsock]:
            s.close()


def test_both_ends_over_pyserial_socket_urls() -> None:
    dev = DeviceServer()
    url = "serial:socket://127.0.0.1:%d" % dev.port
    g = GatewayEnd(url, 11)
    c = CompanionEnd(url, 22)
    w = World()
    w.drivers += [g.d, c.d]
    try:
        g.gw.pubs[1] = ("/chatter", "std_msgs/msg/String", QOS_R)
        assert w.run(3000, until=lambda: bool(g.gw.ups)), "the link did not come up"
        assert w.run(1000, until=lambda: c.comp.live.get(("p", 1)) == "/chatter")
        for i in range(200):
            data = payload(i, 300)
            g.port.publish(1, data, 0, len(data), True)
            w.run(2)
        # 60 kB at 115200 baud (paced to the line rate): about 5.3 s of link time
        w.run(15000, until=lambda: len(c.comp.published.get(1, [])) == 200)
        got = [seqno(d) for d in c.comp.published.get(1, [])]
        assert got == list(range(200)), "reliable data lost, duplicated or reordered"
        assert g.s.counters()["crc_err"] == 0
    finally:
        g.d.close()
        c.d.close()
        dev.close()

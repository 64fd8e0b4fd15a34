"""The two relay paths bench/core_relay.py measures, on CPython and on MicroPython alike (this file
is copied into the MicroPython instance as it is: no typing, no CPython-only modules).

  core(size):  the gateway core: a PUBLISH of `size` bytes from client A in through its decoder
               to the ROS side, a ROS message of `size` bytes out as a MESSAGE in client B's queue.
  naive(size): the same two directions written the usual way: bytes accumulated and sliced,
               struct.unpack per header, the outgoing frame built by concatenation.

Each returns relay(n), which does n round trips.

Run by itself (CPython), it times both paths once: bench/core_relay.py is the full measure.

    .venv/bin/python bench/relay_paths.py [--size 1024] [--count 10000]
"""
import struct

if __name__ == "__main__":  # run by hand (CPython): the repository's modules and ubrb_host
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "ports", "cpython"))
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ubrb_min as U  # noqa: E402
import ubrb_setup  # noqa: E402

QOS = {"reliability": "reliable", "durability": "volatile", "depth": 10}


class SinkRos(U.NullRosPort):
    """The ROS side of the relay: copies each published message into one buffer (as a real port
    copies it out), keeps nothing else."""

    def __init__(self, max_message):
        self.last = bytearray(max_message)
        self.published = 0

    def publish(self, slot, buf, off, n, reliable):
        U.copy_into(self.last, 0, buf, off, n)
        self.published += 1


def request(op, id_, topic):
    return U.encode_json_frame(
        op, {"id": id_, "topic": topic, "type": "std_msgs/msg/String", "qos": QOS}
    )


def publish_frame(size):
    """PUBLISH of `size` zero bytes by publisher id 1."""
    head = bytearray(4)
    U.put_u32(head, 0, 1)
    return U.encode_frame(U.OP_PUBLISH, bytes(head) + bytes(size))


def connect(gw, data):
    """A client slot of `gw` that has sent `data` (whole frames); its queued replies dropped."""
    ci = gw.accept(0)
    dec = gw.clients[ci].decoder
    U.copy_into(dec.buf, dec.fill, data, 0, len(data))
    gw.received(ci, len(data), 0)
    q = gw.clients[ci].queue
    k = q.peek()
    while k:
        q.sent(k)
        k = q.peek()
    return ci


def core(size):
    prof = ubrb_setup.make_profile("mcu", {
        "max_clients": 3, "max_pubs": 4, "max_subs": 4, "max_topics": 6,
        "max_payload": size + 64, "max_control": 512, "queue_bytes": 4 * size + 8192,
        "control_reserve": 1024,
    })
    ros = SinkRos(size + 64)
    gw = U.Gateway(prof, ros=ros)
    gw.ros_up("humble", size + 64)
    hello = U.encode_json_frame(U.OP_HELLO, {"protocol": 1, "client": "bench"})
    a = connect(gw, hello + request(U.OP_ADVERTISE, 1, "/in"))
    b = connect(gw, hello + request(U.OP_SUBSCRIBE, 2, "/out"))
    frame = publish_frame(size)
    msg = bytearray(size)
    slot = gw.subs.find("/out")
    dec = gw.clients[a].decoder
    q = gw.clients[b].queue
    flen = len(frame)

    def relay(n):
        for i in range(n):
            U.copy_into(dec.buf, dec.fill, frame, 0, flen)
            gw.received(a, flen, i)
            gw.ros_message(slot, msg, 0, size)
            q.sent(q.peek())

    return relay


def naive(size):
    frame = publish_frame(size)
    msg = bytes(size)
    state = [b"", None, 0]  # bytes received not yet framed, last published, bytes sent

    def relay(n):
        for _ in range(n):
            rx = state[0] + frame
            while len(rx) >= 12:
                length = struct.unpack("<I", rx[8:12])[0]
                if len(rx) < 12 + length:
                    break
                payload = rx[12:12 + length]
                rx = rx[12 + length:]
                struct.unpack("<I", payload[:4])  # the publisher id
                state[1] = payload[4:]
            state[0] = rx
            out = b"UBRB\x01\x08\x00\x00" + struct.pack("<I", 4 + size) + struct.pack("<I", 2) + msg
            state[2] += len(out)  # (sent and gone)

    return relay


def main():
    import time

    from ubrb_host.cli import positive_int, script_parser

    ap = script_parser("bench/relay_paths.py", __doc__ or "")
    ap.add_argument("--size", type=positive_int, default=1024, help="payload bytes (1024)")
    ap.add_argument("--count", type=positive_int, default=10000, help="relays per path (10000)")
    a = ap.parse_args()
    for name, make in (("core", core), ("naive", naive)):
        relay = make(a.size)
        relay(100)  # warm-up
        t0 = time.perf_counter()
        relay(a.count)
        us = (time.perf_counter() - t0) / a.count * 1e6
        print("%-5s %8.2f us per relay (one PUBLISH in, one MESSAGE out; %d B)" % (name, us, a.size))


if __name__ == "__main__":
    main()

# The frame decoder: split points, many frames per read, malformed headers, per-op caps.
import ubrb_min as U
from tests.support.ubrb_frames import advertise, hello, publish

CPYTHON_ONLY: set = set()


def decoder(max_bulk=1024, max_control=256):
    return U.FrameDecoder(max_bulk, max_control, U.OP_PUBLISH, U.CLIENT_OPS)


def drain(d):
    out = []
    while True:
        op = d.next()
        if op == U.NEED_MORE:
            return out
        assert op != U.MALFORMED, d.error
        out.append((op, bytes(d.buf[d.poff : d.poff + d.plen])))


def stream():
    return (
        hello()
        + advertise(1, "/chatter")
        + publish(1, b"\x00\x01\x00\x00hello")
        + U.encode_frame(U.OP_PING, b"")
        + publish(1, b"")
    )


def expected():
    d = decoder()
    d.feed(stream())
    return drain(d)


def test_many_frames_in_one_read():
    frames = expected()
    assert [f[0] for f in frames] == [U.OP_HELLO, U.OP_ADVERTISE, U.OP_PUBLISH, U.OP_PING, U.OP_PUBLISH]
    assert frames[2][1][4:] == b"\x00\x01\x00\x00hello"
    assert frames[3][1] == b""


def test_every_split_point_of_a_multi_frame_stream():
    data = stream()
    want = expected()
    for cut in range(len(data) + 1):
        d = decoder()
        d.feed(data[:cut])
        got = drain(d)
        d.feed(data[cut:])
        got += drain(d)
        assert got == want, "split at %d" % cut


def test_one_byte_at_a_time():
    data = stream()
    d = decoder()
    got = []
    for i in range(len(data)):
        d.feed(data[i : i + 1])
        got += drain(d)
    assert got == expected()


def test_large_frames_back_to_back_reuse_the_buffer():
    # Two max-size PUBLISH frames after a small one: the decoder must compact and keep going.
    big = bytes(range(256)) * 4  # 1024 bytes = max_bulk
    rev = bytes(reversed(big))
    data = hello() + U.encode_frame(U.OP_PUBLISH, big) + U.encode_frame(U.OP_PUBLISH, rev)
    d = decoder()
    got = []
    o = 0
    while o < len(data):
        o += d.feed(data[o : o + 700])
        got += drain(d)
    assert [f[0] for f in got] == [U.OP_HELLO, U.OP_PUBLISH, U.OP_PUBLISH]
    assert got[1][1] == big and got[2][1] == rev


def malformed(header_and_more):
    d = decoder()
    d.feed(header_and_more)
    return d.next() == U.MALFORMED, d.error


def test_bad_magic_is_malformed():
    bad, why = malformed(b"UBRX" + hello()[4:])
    assert bad and "magic" in why


def test_bad_version_is_malformed():
    f = bytearray(hello())
    f[4] = 2
    bad, why = malformed(bytes(f))
    assert bad and "version" in why


def test_unknown_and_bridge_only_ops_are_malformed():
    for op in (0, U.OP_HELLO_ACK, U.OP_MESSAGE, U.OP_SUB_COUNT, U.OP_ERROR, 13, 200):
        bad, why = malformed(U.encode_frame(op, b""))
        assert bad, op


def test_header_is_checked_before_the_payload_arrives():
    # Only the 12 header bytes of a frame announcing 1 GiB: rejected at once, nothing buffered.
    h = bytearray(12)
    U.put_header(h, 0, U.OP_PUBLISH, 0)
    h[11] = 0x40
    bad, why = malformed(bytes(h))
    assert bad
    h2 = bytearray(12)
    U.put_header(h2, 0, U.OP_PUBLISH, 1025)
    bad, why = malformed(bytes(h2))
    assert bad and "1025" in why


def test_caps_per_op():
    # PUBLISH may use the bulk cap; every other op only the control cap.
    d = decoder()
    d.feed(U.encode_frame(U.OP_PUBLISH, bytes(1024)))
    assert d.next() == U.OP_PUBLISH
    d = decoder()
    d.feed(U.encode_frame(U.OP_ADVERTISE, bytes(256)))
    assert d.next() == U.OP_ADVERTISE
    for op in (U.OP_HELLO, U.OP_ADVERTISE, U.OP_SUBSCRIBE, U.OP_PING, U.OP_UNADVERTISE):
        h = bytearray(12)
        U.put_header(h, 0, op, 257)
        bad, why = malformed(bytes(h))
        assert bad, op


def test_encode_frame_layout():
    f = U.encode_frame(U.OP_PING, b"ab")
    assert f == b"UBRB\x01\x0a\x00\x00\x02\x00\x00\x00ab"

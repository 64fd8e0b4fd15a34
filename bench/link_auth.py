"""The keyed link's cost per frame (docs/LINK.md "Authentication"): HMAC-SHA256 trailer time and
bytes allocated, beside the same traffic unkeyed. Runs on CPython and on MicroPython:

    .venv/bin/python bench/link_auth.py          # CPython
    node bench/mp_run.mjs bench/link_auth.py     # MicroPython 1.27 (the WebAssembly build)

Two sans-IO LinkSessions joined in memory (UDP framing). One "exchange" is a 64-byte reliable
message in its own frame and the ACK frame coming back: 2 frames, each MAC'd by its sender and
checked by its receiver. Time is per frame (send + receive, both ends' work). Bytes allocated:
on MicroPython every heap byte allocated (gc.mem_alloc with the collector off), per frame; on
CPython the most Python-heap bytes live at once during an exchange above what was live before
(tracemalloc peak; OpenSSL's hash contexts are outside it, so the Python objects of one MAC are
listed too). CPython frees everything at once; on MicroPython it is garbage until a collection.
"""
import sys

MP = sys.implementation.name == "micropython"
if MP:
    sys.path.insert(0, ".")  # bench/mp_run.mjs: the repository's files in the cwd
else:
    import os

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "ports", "cpython"))  # ubrb_host
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ubrb_min as L  # noqa: E402
import ubrb_keyed  # noqa: E402
KEY = bytes(range(32))

if MP:
    import gc
    import time

    def clock_us():
        return time.ticks_us()

    def elapsed_us(t0):
        return time.ticks_diff(time.ticks_us(), t0)
else:
    import gc
    import time
    import tracemalloc

    def clock_us():
        return time.perf_counter_ns() // 1000

    def elapsed_us(t0):
        return time.perf_counter_ns() // 1000 - t0


class Null:
    def link_up(self, fresh):
        pass

    def link_down(self):
        pass

    def link_message(self, t, slot, buf, off, n, reliable):
        pass


def pair(key):
    g = L.LinkSession(Null(), 11, True, True, 1400, 4096, 16, 65536, 32768, 256, key)
    c = L.LinkSession(Null(), 22, False, True, 1400, 4096, 16, 65536, 32768, 256, key)
    now = 1000
    for _ in range(20):
        for x, y in ((g, c), (c, g)):
            n = x.poll_tx(now)
            if n:
                y.feed(x.tx_buf, 0, n, now)
        now += 1
    assert g.is_up() and c.is_up()
    return g, c


def exchange(g, c, msg, size, now):
    g.send(L.LK_T_PUB, 1, msg, 0, size, True)
    n = g.poll_tx(now)
    c.feed(g.tx_buf, 0, n, now)
    n = c.poll_tx(now)
    g.feed(c.tx_buf, 0, n, now)


# stat_counts' index of tx_frames, from the list of names (the core's _LKC_ constants are
# compile-time only on MicroPython)
TX_FRAMES = L._LK_COUNTERS.split().index("tx_frames")


def measure(key, size, rounds):
    g, c = pair(key)
    msg = bytearray(size)
    for _ in range(50):
        exchange(g, c, msg, size, 2000)       # warm-up
    f0 = g.stat_counts[TX_FRAMES] + c.stat_counts[TX_FRAMES]
    gc.collect()
    t0 = clock_us()
    for _ in range(rounds):
        exchange(g, c, msg, size, 2000)
    us = elapsed_us(t0)
    frames = g.stat_counts[TX_FRAMES] + c.stat_counts[TX_FRAMES] - f0
    # allocation, in a separate run (tracing slows CPython down)
    k = rounds // 4
    gc.collect()
    if MP:
        gc.disable()
        a0 = gc.mem_alloc()
        for _ in range(k):
            exchange(g, c, msg, size, 2000)
        alloc = gc.mem_alloc() - a0
        gc.enable()
    else:
        tracemalloc.start()
        alloc = 0
        for _ in range(k):
            cur = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            exchange(g, c, msg, size, 2000)
            alloc += tracemalloc.get_traced_memory()[1] - cur
        tracemalloc.stop()
    assert g.stat_counts[L.LKC_AUTH] == 0 and c.stat_counts[L.LKC_AUTH] == 0
    return us / frames, alloc / (2 * k)


def hmac_only(size, rounds):
    ki, ko = ubrb_keyed.lk_hmac_pads(KEY)
    data = bytearray(size)
    mv = memoryview(data)
    t0 = clock_us()
    for _ in range(rounds):
        ubrb_keyed.lk_hmac(ki, ko, mv[0:size])
    return elapsed_us(t0) / rounds


def main():
    if not MP:  # the command line every program has: --version, -v/-q, a mistake in one line
        from ubrb_host.cli import script_parser

        script_parser("bench/link_auth.py", __doc__ or "").parse_args()
    rounds = 10000 if MP else 20000  # the WebAssembly clock ticks in ms: runs of >= 1 s
    print("runtime: %s %s" % (sys.implementation.name, sys.version.split()[0]))
    print("per frame (send + receive, 64-byte message frames and their ACK frames, %d exchanges)"
          % rounds)
    print("%-9s %12s %16s" % ("link", "us/frame", "bytes/frame"))
    res = {}
    for name, key in (("unkeyed", None), ("keyed", KEY)):
        us, b = measure(key, 64, rounds)
        res[name] = (us, b)
        print("%-9s %12.2f %16.1f" % (name, us, b))
    du = res["keyed"][0] - res["unkeyed"][0]
    db = res["keyed"][1] - res["unkeyed"][1]
    print("keyed - unkeyed: %+.2f us/frame (x%.2f), %+.1f bytes/frame"
          % (du, res["keyed"][0] / res["unkeyed"][0], db))
    print("HMAC-SHA256 alone (two hash objects; one side of a frame):")
    for size in (32, 84, 1400):
        print("  over %4d bytes: %8.2f us" % (size, hmac_only(size, rounds)))
    if not MP:
        import hashlib

        # OpenSSL allocates the hash contexts (outside tracemalloc): the Python objects of one
        # MAC, by size, are what a keyed frame adds on each side
        h = hashlib.sha256()
        objs = (h, h, h.digest(), h.digest(), memoryview(bytearray(8))[0:4])
        print("  Python objects per MAC: 2 hash objects (%d B each), 2 digests (%d B each), one "
              "memoryview slice (%d B): %d B, freed at once"
              % (sys.getsizeof(h), sys.getsizeof(objs[2]), sys.getsizeof(objs[4]),
                 sum(sys.getsizeof(o) for o in objs)))


if __name__ == "__main__":
    main()

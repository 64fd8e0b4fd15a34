# The board's entry point: the generated main.py (tools/deploy.py) and `micropython ubrb_min.py`
# land in main() here. Start-up is done by modules that are unloaded once they have done their
# job, so that what stays in the heap while serving is the core (ubrb_min), the loop and the
# link driver, and the buffers of the budget (on a board without PSRAM every KiB counts:
# MicroPython copies a .mpy file's bytecode into the heap):
#
#   1. gateway.py with ubrb_setup (options, profile, link URL and sizes, key, policy, budget
#      printed, Wi-Fi up): gateway.boot() -> options and profile; then both are unloaded;
#   2. build.py: the link, the Gateway, the GatewayLoop - the buffers; then unloaded;
#   3. the loop serves until Ctrl-C.
#
# Optional features load only when configured: ubrb_policy with a policy flag (imported by
# ubrb_setup's parser: it stays, the Gateway runs its checks), ubrb_keyed with --link-key (by
# the LinkSession built with a key), ubrb_stream with a serial link (by a stream LinkSession).
#
# It prints the one figure a user sizing a board reads - the worst-case budget (buffers, topic
# strings, link session) plus the heap the loaded code and module state take.
import gc
import sys


def heap():
    """(used, free) heap bytes after a collection; (0, 0) where gc has no figures (CPython)."""
    gc.collect()
    try:
        return gc.mem_alloc(), gc.mem_free()
    except AttributeError:
        return 0, 0


def fail(status, why):
    """One line on stderr for a person; the exit status."""
    print("ubrb_min.py: %s" % why, file=sys.stderr)
    return status


def unload(name):
    """Forget module `name` (sys.modules and its package's attribute) so the collector can free
    its bytecode and globals once nothing else refers to them."""
    sys.modules.pop(name, None)
    pkg, _, attr = name.rpartition(".")
    parent = sys.modules.get(pkg)
    if parent is not None and attr in parent.__dict__:
        delattr(parent, attr)


# what start-up imports and unloads again before serving
START_UP_MODULES = ("ports.micropython.gateway", "ubrb_setup", "ports.micropython.build")


def main(argv=None, io=None):
    """Run the gateway. argv: a list of flags (as sys.argv[1:]) or a dict of options. Returns the
    exit status: 0 after Ctrl-C (or --help), 2 for bad options, 1 when the network, the listener
    or the heap does not allow a start."""
    from ports.micropython import gateway

    first = gateway.boot(argv, io)
    gateway = None
    # config.py (the options and Wi-Fi credentials boot() read) has done its job too: compiled
    # from source on the board, its module is ~1 KiB of heap
    for name in START_UP_MODULES + ("config",):
        unload(name)
    if isinstance(first, int):
        return first
    opts, profile, budget, io, log = first
    first = None
    io.config = None
    code = heap()[0]  # the code that stays (core, loop, link, optional features) is loaded
    from ports.micropython import build

    try:
        loop = build.build(opts, profile, io, log)
    except ValueError as e:
        return fail(2, e)
    except OSError as e:
        return fail(1, e)
    except MemoryError:
        free = heap()[1]
        return fail(1, "not enough heap for profile %s (%d bytes free after the code): lower the "
                       "limits (--help lists them) or use a board with more RAM"
                    % (opts["profile"], free))
    finally:
        build = None
        unload("ports.micropython.build")
    opts = None  # the options are in the objects built now (~0.6 KiB as a dict)
    used, free = heap()
    line = ("memory: budget %.1f KiB + code %.1f KiB = %.1f KiB; heap after start-up: %d bytes "
            "used, %d free" % (budget / 1024, code / 1024, (budget + code) / 1024, used, free))
    log("info", line)
    return loop.run()

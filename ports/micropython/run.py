# The board's entry point: the generated main.py (tools/deploy.py) and `micropython ubrb_min.py`
# land in main() here. It starts the gateway with gateway.py, then unloads gateway.py before
# serving: options, usage, Wi-Fi and start-up are code that has done its job, and on a board
# without PSRAM every KiB of heap counts (ports/micropython/README.md, "Memory"). It then prints
# the one figure a user sizing a board reads - the worst-case budget (buffers, topic strings, link
# session) plus the heap the loaded code and module state take - and serves until Ctrl-C.
import gc
import sys

GATEWAY_MODULE = "ports.micropython.gateway"


def heap():
    """(used, free) heap bytes after a collection; (0, 0) where gc has no figures (CPython)."""
    gc.collect()
    try:
        return gc.mem_alloc(), gc.mem_free()
    except AttributeError:
        return 0, 0


def unload(name):
    """Forget module `name` (sys.modules and its package's attribute) so the collector can free
    its bytecode and globals once nothing else refers to them."""
    sys.modules.pop(name, None)
    pkg, _, attr = name.rpartition(".")
    parent = sys.modules.get(pkg)
    if parent is not None and attr in parent.__dict__:
        delattr(parent, attr)


def main(argv=None, io=None):
    """Run the gateway. argv: a list of flags (as sys.argv[1:]) or a dict of options. Returns the
    exit status: 0 after Ctrl-C, 2 for bad options, 1 when the network, the listener or the
    heap does not allow a start."""
    start_used = heap()[0]
    import ubrb_min as core
    from ports.micropython import link, loop  # noqa: F401  (what stays loaded while serving)

    code = heap()[0] - start_used  # the core and the loop/link modules: bytecode, qstrs, globals
    from ports.micropython import gateway

    started = gateway.boot(argv, io)
    gateway = None
    if isinstance(started, int):
        return started
    unload(GATEWAY_MODULE)
    lp = started
    used, free = heap()
    lp.log("info", "memory: budget %s + code %s = %s; heap after start-up: %d bytes used, %d free"
           % (core.human_bytes(lp.budget), core.human_bytes(code), core.human_bytes(lp.budget + code),
              used, free))
    return lp.run()

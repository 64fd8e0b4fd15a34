"""ubrb_host: the CPython runtime shared by the gateway port and the companion.

Both CPython programs of the project run on it:

- ``python ubrb_min.py`` (ports/cpython/gateway.py): the gateway on a Pi or a PC;
- ``python -m ros_side``: the companion, in link mode (the other end of the link) or in direct
  mode (the gateway core in-process).

What it holds is everything those two do the same way on CPython, and nothing of either one:

- ``ubrb_host.loop``: the selectors loop serving UBRB clients for a core ``Gateway``
  (``GatewayServer``), the monotonic clock (``now_ms``), the allocation policy for big buffers
  (``mapped_buffer``);
- ``ubrb_host.link``: the link transports (UDP, serial) and ``LinkDriver``, which moves bytes
  between a transport and a core ``LinkSession``;
- ``ubrb_host.cli``: the argument layer (``--link``/``--baud``/``--link-mtu``, one flag per limit
  from the core's ``LIMITS`` table, ``--log-level``), profile loading and logging.

The protocol itself (framing, sessions, registry, link session, link URL grammar, buffer sizes,
pacing arithmetic) is in the core, ``ubrb_min``; this package only does I/O and time.

In the source tree it lives in ports/cpython/ (next to the gateway port) and is put on sys.path by
the launchers; installed (``pip install .``) it is a top-level package of its own.
"""


# A Ctrl-C (KeyboardInterrupt) that CPython could not raise where it landed: inside a weakref
# callback or a __del__ (importlib's module-lock clean-up while a module loads is one), CPython
# prints "Exception ignored in ..." and goes on - the program would start and serve as if no
# Ctrl-C had come. catch_stray_interrupts() keeps it here instead; cli.stop_on_signals raises it
# where the program puts its own SIGINT handler in place.
stray_interrupt = False


def catch_stray_interrupts() -> None:
    """Keep a KeyboardInterrupt CPython reports as unraisable (see stray_interrupt), in place of
    its 'Exception ignored' lines; every other unraisable exception goes to the hook there was.
    The programs call it first thing (ubrb_min.py's launcher, ros_side's __main__)."""
    import sys

    previous = sys.unraisablehook

    def hook(unraisable: "sys.UnraisableHookArgs") -> None:
        global stray_interrupt
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            stray_interrupt = True
        else:
            previous(unraisable)

    sys.unraisablehook = hook


def gateway_main() -> int:
    """The `ubrb-gateway` command (setup.py): ubrb_host.gateway.main, imported here so that a
    Ctrl-C while the program loads is the quiet exit 130 of the rest of start-up too."""
    try:
        catch_stray_interrupts()
        from .gateway import main

        return main()
    except KeyboardInterrupt:  # while it loads, or in the instant before run_program's handling
        return 130

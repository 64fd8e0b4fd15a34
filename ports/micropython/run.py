# The board's entry point: the generated main.py (tools/deploy.py) and `micropython ubrb_min.py`
# land in main() here. Start-up is done in two halves so the code of the first is gone before
# the second allocates the gateway's buffers:
#
#   1. gateway.py (options, usage, Wi-Fi, the budget printed): boot() -> options and profile;
#      then gateway.py is unloaded - code that has done its job, and on a board without PSRAM
#      every KiB of heap counts (ports/micropython/README.md, "Memory");
#   2. build() here: the link, the Gateway, the GatewayLoop - the buffers of the budget.
#
# It then prints the one figure a user sizing a board reads - the worst-case budget (buffers,
# topic strings, link session) plus the heap the loaded code and module state take - and serves
# until Ctrl-C.
import gc
import sys

import ubrb_min as core
from ports.micropython import link as mlink
from ports.micropython.loop import GatewayLoop, parse_hostport

# What only start-up uses, per module: options and profiles, the budget's text, link URL and key
# parsing, the sizing of the link session, the Policy parser. Once the gateway is built, the
# board's copy of each module forgets these names (forget_start_up), so the collector frees
# their code: MicroPython copies a .mpy file's bytecode into the heap, and this is ~6 KiB of it
# that serving never runs again. The logic itself stays where it is, one copy, for CPython, the
# tests and the next start (a soft reset, Ctrl-D, loads the modules whole again; run main()
# again in one session only after `unload`ing them - main() does that when it returns).
# tests/core/test_mp_port.py checks that every name still exists. The link's two transport
# classes are listed too: the one in use lives on through its instance, the other (~0.7 KiB from
# a .mpy file) is freed. "Class.method" names a method: the constructors of classes whose every
# instance start-up builds (~3 KiB from .mpy files), Gateway.set_policy, the Policy's parser (a
# method's name comes before its class's: the class is looked up by name).
START_UP_ONLY = (
    ("ubrb_min", "Gateway.__init__ Gateway.set_policy ClientSession.__init__ "
                 "FrameDecoder.__init__ SendQueue.__init__ FrameRing.__init__ Registry.__init__ "
                 "SlotTable.__init__ RateLog.__init__ LinkSession.__init__ LinkRosPort.__init__ "
                 "LinkOutput.__init__ "
                 "PROFILES LIMITS PROFILE_KEYS make_profile memory_budget throttle_bytes "
                 "format_budget POLICY_OPTIONS split_list parse_globs parse_cidrs "
                 "parse_throttle Policy.__init__ Policy.from_options Policy.describe "
                 "Throttle.__init__ Policy Throttle NullRosPort parse_link_key link_needs_key "
                 "parse_link_url link_sizes new_link_session"),
    ("ports.micropython.link", "LinkDriver.__init__ UdpTransport.__init__ "
                               "UartTransport.__init__ "
                               "uart_id open_gateway_link UdpTransport UartTransport"),
    ("ports.micropython.loop", "GatewayLoop.__init__ Log.__init__ Clock.__init__ IO.__init__ "
                               "default_io parse_hostport"),
    ("ports.micropython.run", "build"),
)
# ...and what only an active Policy (--allow-clients, --allow-topics, --deny-topics, --throttle)
# runs while serving: forgotten too when none is given (~1 KiB of bytecode from .mpy files).
POLICY_ONLY = (
    ("ubrb_min", "glob_match parse_ip _parse_ip4 peer_address cidr_match Gateway._topic_denied "
                 "Gateway._throttle_slot Gateway._release_throttled"),
)
# ...and what only a keyed link (--link-key) runs: the MAC of each frame, forgotten on a link
# without a key (~0.7 KiB from .mpy files).
KEY_ONLY = (
    ("ubrb_min", "lk_hmac lk_hmac_pads LinkSession._mac_out LinkSession._mac_ok"),
)


def forget_start_up(policy=False, keyed=False):
    """Drop START_UP_ONLY's names from their modules (see above), POLICY_ONLY's unless the
    gateway serves with a `policy`, KEY_ONLY's unless its link is `keyed`; how many were
    there."""
    n = 0
    for mod, names in (START_UP_ONLY + (() if policy else POLICY_ONLY)
                       + (() if keyed else KEY_ONLY)):
        m = sys.modules.get(mod)
        for name in names.split():
            owner, _, attr = name.rpartition(".")
            owner = m.__dict__.get(owner) if owner and m is not None else m
            if owner is not None and attr in owner.__dict__:
                # None first: MicroPython keeps a class attribute's value reachable after a
                # delattr (in the slot it leaves, until reused), a module's it clears
                setattr(owner, attr, None)
                delattr(owner, attr)
                n += 1
    return n


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


def build(opts, profile, io, log):
    """The second half of start-up: the link, the Gateway and the GatewayLoop, listening."""
    ros, drv = mlink.open_gateway_link(
        io, opts["link"], baud=opts["baud"], mtu=opts["link_mtu"],
        max_message=profile["max_payload"], tx=opts["tx"], rx=opts["rx"],
        max_slots=profile["max_topics"], key=opts["key"],
    )
    if drv is None:
        log("warning", "no --link: running without a ROS side (PUBLISH frames are dropped)")
    gw = core.Gateway(profile, ros=ros, log=log)
    if opts["policy"].active():
        gw.set_policy(opts["policy"])
    loop = GatewayLoop(gw, parse_hostport(opts["listen"]), link=drv, ros=ros, io=io, log=log,
                       stats_ms=opts["stats_ms"])
    log("info", "UBRB gateway %s listening on %s:%d, link %s"
        % (core.VERSION, loop.listen_addr[0], loop.listen_addr[1], opts["link"]))
    return loop


def main(argv=None, io=None):
    """Run the gateway. argv: a list of flags (as sys.argv[1:]) or a dict of options. Returns the
    exit status: 0 after Ctrl-C (or --help), 2 for bad options, 1 when the network, the listener
    or the heap does not allow a start."""
    code = heap()[0]  # this module and what it imports are loaded: the code that stays
    from ports.micropython import gateway

    first = gateway.boot(argv, io)
    gateway = None
    unload("ports.micropython.gateway")
    if isinstance(first, int):
        return first
    opts, profile, budget, io, log = first
    first = None
    # config.py (the options and Wi-Fi credentials boot() read) has done its job too: compiled
    # from source on the board, its module is ~1 KiB of heap
    io.config = None
    unload("config")
    heap()
    try:
        loop = build(opts, profile, io, log)
    except ValueError as e:
        return fail(2, e)
    except OSError as e:
        return fail(1, e)
    except MemoryError:
        free = heap()[1]
        return fail(1, "not enough heap for profile %s (%d bytes free after the code): lower the "
                       "limits (--help lists them) or use a board with more RAM"
                    % (opts["profile"], free))
    opts = None  # the options are in the objects built now (~0.6 KiB as a dict)
    before = heap()[0]
    forget_start_up(loop.gw.policy is not None, loop.link is not None and loop.link.s.tag != 0)
    used, free = heap()
    code -= before - used  # the start-up code just freed is not part of what stays loaded
    line = "memory: budget %s + code %s = %s; heap after start-up: %%d bytes used, %%d free" % (
        core.human_bytes(budget), core.human_bytes(code), core.human_bytes(budget + code))
    log("info", line % (used, free))
    try:
        return loop.run()
    finally:
        # the modules miss their start-up names now: the next main() in this session loads
        # them again
        for mod, _ in START_UP_ONLY:
            unload(mod)

# The second half of the board's start-up: the link session, the Gateway and the GatewayLoop -
# the buffers of the budget. ports/micropython/run.py imports this module once gateway.py (the
# options) and ubrb_setup (the profiles, the link's grammar and sizing) are unloaded, calls
# build(), and unloads it too: nothing here runs again while the gateway serves.
import ubrb_min as core
from ports.micropython import link as mlink
from ports.micropython.loop import GatewayLoop


def open_gateway_link(io, opts, max_slots, hold=0):
    """(LinkRosPort, LinkDriver) for the link gateway.prepare() parsed into `opts`, or (None,
    None) for 'none'. The session's sizes are prepare()'s (ubrb_setup.link_sizes); `hold`:
    frames kept past a gap (build)."""
    kind = opts["link_kind"]
    if kind == "none":
        return None, None
    z = opts["sizes"]
    if kind == "udp":
        t = mlink.UdpTransport(io.socket, io.select, opts["link_where"], opts["link_port"],
                               z["max_frame"])
    else:
        if io.machine is None:
            raise ValueError("serial links need the machine module (not on this port)")
        from ports.micropython.uart import UartTransport

        t = UartTransport(io.machine, opts["link_port"], opts["baud"], z["max_frame"],
                          opts["tx"], opts["rx"])
    s = core.LinkSession(None, mlink.new_epoch(io.time), True, t.datagram, z["max_frame"],
                         z["max_message"], z["window"], z["rel_bytes"], z["be_bytes"],
                         max_slots, opts["key"], lambda: mlink.new_epoch(io.time), hold,
                         z["frames"])
    return core.LinkRosPort(s), mlink.LinkDriver(t, s)


def check_heap(opts, io):
    """ValueError (the options' mistake: exit 2) when the worst-case budget gateway.prepare()
    worked out is more than the heap has free now, the start-up modules unloaded, before one
    buffer of it is allocated; on CPython (the tests' fakes) nothing is checked. Returns the
    bytes free (None on CPython)."""
    import gc

    gc.collect()
    mem_free = io.mem_free or getattr(gc, "mem_free", None)
    if mem_free is None:
        return None
    free = mem_free()
    if opts["budget"] > free:
        raise ValueError("%s: the worst-case memory budget, %s, is more than the heap has free "
                         "(%d bytes): lower it (--help lists the limits)"
                         % (opts["budget_fix"], opts["budget_text"], free))
    return free


def build(opts, profile, io, log):
    """The link, the Gateway and the GatewayLoop, listening (check_heap first)."""
    free = check_heap(opts, io)
    hold = 0
    z = opts["sizes"]
    if z is not None and free is not None:
        # Frames kept past a gap (selective repeat: the companion resends only what is missing,
        # docs/LINK.md section 5) take a window of frames and ubrb_hold's code (~2 KiB): kept
        # only where the heap holds them beside the budget and 32 KiB free (issue 19's), else
        # the companion goes back over what this end did not keep, on its NAK
        n = 8
        while n < z["window"]:
            n *= 2
        cost = n * (z["max_frame"] + 3) + 2048
        if free - opts["budget"] >= cost + 32768:
            hold = z["window"]
        log("info", "link: %s frames past a gap (%d B; %d B free beyond the budget, %d needed)"
            % ("keeps" if hold else "keeps no", cost, free - opts["budget"], cost + 32768))
    ros, drv = open_gateway_link(io, opts, profile["max_topics"], hold)
    if drv is None:
        log("warning", "no --link: running without a ROS side (PUBLISH frames are dropped)")
    gw = core.Gateway(profile, ros=ros, log=log)
    if opts["policy"] is not None:
        opts["policy"].install(gw)
    loop = GatewayLoop(gw, opts["listen_addr"], io, link=drv, ros=ros, log=log,
                       stats_ms=opts["stats_ms"])
    log("info", "UBRB gateway %s listening on %s:%d, link %s"
        % (core.VERSION, loop.listen_addr[0], loop.listen_addr[1], opts["link"]))
    return loop

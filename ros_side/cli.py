"""Command-line pieces of the companion that belong to ``ros_side`` (the lead wires __main__).

``add_arguments(parser)`` adds the ROS options; ``make_companion(args, sink, max_message)``
builds the backend and the Companion from them. ``strip_ros_args(argv)`` removes the
``--ros-args ... [--]`` section that ``ros2 run``/``ros2 launch`` append.
"""

from .backends import make_backend
from .companion import Companion


def add_arguments(parser):
    # ubrb_host is on sys.path once ros_side.__main__ has found the source tree (or installed)
    from ubrb_host.cli import domain_id, ros_distro

    g = parser.add_argument_group("ROS side")
    g.add_argument("--backend", choices=("auto", "rclpy", "dds"), default="auto",
                   help="auto: rclpy if it can run here, else dds (default: auto)")
    g.add_argument("--domain", type=domain_id, default=None, metavar="N",
                   help="DDS domain id 0-232 (default: ROS_DOMAIN_ID, else 0)")
    g.add_argument("--ros-distro", type=ros_distro, default=None, metavar="DISTRO",
                   help="dds backend: message definitions of this ROS 2 distro "
                        "(default: ROS_DISTRO if set, else humble)")
    g.add_argument("--msg-path", action="append", default=[], metavar="DIR", type=_msg_dir,
                   help="dds backend: add the message packages DIR/<pkg>/msg/*.msg (repeatable)")
    g.add_argument("--node-name", default="ros_side", help="rclpy backend: node name")
    g.add_argument("--no-diagnostics", action="store_true",
                   help="do not publish /diagnostics")
    g.add_argument("--max-history-bytes", type=_size, default=None, metavar="N",
                   help="what DDS writers and readers may hold for the gateway's topics, "
                        "counted as held (a writer its last depth samples); a message beyond "
                        "it is not written and gets ERROR resource_exhausted (suffixes K, M, G; "
                        "default half the physical memory)")
    return parser


def _msg_dir(text):
    """--msg-path DIR: a directory this process can list (its DIR/<pkg>/msg/*.msg are read when
    the backend starts), checked while the command line is read."""
    import argparse
    import os
    path = os.path.expanduser(str(text))
    if not os.path.isdir(path):
        why = "is not a directory" if os.path.exists(path) else "does not exist"
        raise argparse.ArgumentTypeError("%s %s (give the directory that holds <pkg>/msg/*.msg)"
                                         % (text, why))
    if not os.access(path, os.R_OK | os.X_OK):
        raise argparse.ArgumentTypeError("%s cannot be read (permission denied)" % text)
    return path


def _size(text):
    """'512M' -> 536870912 (suffixes K, M, G: powers of 1024)."""
    import argparse
    t = str(text).strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        n = int(t[:-1] if mult > 1 else t)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a byte count such as 268435456 or 256M, "
                                         "got %r" % text) from None
    if n < 0:
        raise argparse.ArgumentTypeError("must not be negative: %r" % text)
    return n * mult


def ros_params_as_flags(argv):
    """`--ros-args -p name:=value ...` as command-line flags, so every flag is also a ROS parameter.

    `ros2 run ros_side ros_side --ros-args -p link:=udp://0.0.0.0:8269 -p baud:=921600` is
    `--link udp://0.0.0.0:8269 --baud 921600`; a boolean flag takes `name:=true`. Flags given
    on the command line itself come after these and win.
    """
    flags, in_ros, i = [], False, 0
    while i < len(argv):
        a = argv[i]
        if a == "--ros-args":
            in_ros = True
        elif a == "--":
            in_ros = False
        elif in_ros and a in ("-p", "--param") and i + 1 < len(argv):
            name, sep, value = argv[i + 1].partition(":=")
            i += 1
            if sep and name and "." not in name and not name.startswith("use_sim_time"):
                flag = "--" + name.replace("_", "-")
                if value.lower() in ("true", "false"):
                    if value.lower() == "true":
                        flags.append(flag)
                else:
                    flags += [flag, value]
        i += 1
    return flags


def strip_ros_args(argv):
    out, skipping = [], False
    for a in argv:
        if a == "--ros-args":
            skipping = True
            continue
        if skipping:
            if a == "--":
                skipping = False
            continue
        out.append(a)
    return out


def make_companion(args, sink=None, max_message=64 * 1024 * 1024, **kw):
    backend = make_backend(args.backend, domain=args.domain, distro=args.ros_distro,
                           msg_paths=args.msg_path, node_name=args.node_name)
    if args.no_diagnostics:
        kw["diagnostics_period_ms"] = 0
    if getattr(args, "max_history_bytes", None) is not None:
        kw["max_history_bytes"] = args.max_history_bytes
    return Companion(backend, sink, max_message, **kw)

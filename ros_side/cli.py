"""Command-line pieces of the companion that belong to ``ros_side`` (the lead wires __main__).

``add_arguments(parser)`` adds the ROS options; ``make_companion(args, sink, max_message)``
builds the backend and the Companion from them. ``strip_ros_args(argv)`` removes the
``--ros-args ... [--]`` section that ``ros2 run``/``ros2 launch`` append.
"""

from .backends import make_backend
from .companion import Companion


def add_arguments(parser):
    g = parser.add_argument_group("ROS side")
    g.add_argument("--backend", choices=("auto", "rclpy", "dds"), default="auto",
                   help="auto: rclpy if it can run here, else dds (default: auto)")
    g.add_argument("--domain", type=int, default=None,
                   help="DDS domain id (default: ROS_DOMAIN_ID, else 0)")
    g.add_argument("--ros-distro", default=None,
                   help="dds backend: message definitions of this ROS 2 distro "
                        "(default: ROS_DISTRO if set, else humble)")
    g.add_argument("--msg-path", action="append", default=[], metavar="DIR",
                   help="dds backend: add the message packages DIR/<pkg>/msg/*.msg (repeatable)")
    g.add_argument("--node-name", default="ros_side", help="rclpy backend: node name")
    g.add_argument("--no-diagnostics", action="store_true",
                   help="do not publish /diagnostics")
    return parser


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
    return Companion(backend, sink, max_message, **kw)

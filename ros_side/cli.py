"""Command-line pieces of the companion that belong to ``ros_side`` (the lead wires __main__).

``add_arguments(parser)`` adds the ROS options; ``make_companion(args, sink, max_message)``
builds the backend and the Companion from them. ``strip_ros_args(argv)`` removes the
``--ros-args ... [--]`` section that ``ros2 run``/``ros2 launch`` append, and
``ros_params_as_flags(argv)`` turns what that section says into flags: ``-p name:=value`` is
``--name value``, ``-r FROM:=TO`` is ``--remap FROM:=TO``; anything else there is refused (one
line, exit 2), since neither backend would honour it (ros_side resolves names itself, and rcl
sees no command line of ours).
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
    g.add_argument("--node-name", default="ros_side", type=_node_name, metavar="NAME",
                   help="the node's name (default ros_side; --ros-args -r __node:=NAME wins)")
    g.add_argument("--namespace", default="/", type=_namespace, metavar="NS",
                   help="put the node under namespace NS (e.g. /robot1): a client's relative "
                        "topic names (odom, ~/x) resolve under it; absolute ones (/odom) stay, "
                        "unless remapped (default /; --ros-args -r __ns:=NS wins)")
    g.add_argument("--remap", action="append", default=[], type=_remap, metavar="FROM:=TO",
                   help="remap a topic as rcl does (e.g. /odom:=/robot1/odom; the first "
                        "matching rule wins; repeatable; --ros-args -r FROM:=TO is the same)")
    g.add_argument("--no-diagnostics", action="store_true",
                   help="do not publish /diagnostics")
    g.add_argument("--max-history-bytes", type=_size, default=None, metavar="N",
                   help="what DDS writers and readers may hold for the gateway's topics, "
                        "counted as held (a writer its last depth samples); a message beyond "
                        "it is not written and gets ERROR resource_exhausted (suffixes K, M, G; "
                        "default half the physical memory)")
    return parser


def _node_name(text):
    import argparse
    from .names import node_name_error
    err = node_name_error(text)
    if err is not None:
        raise argparse.ArgumentTypeError("%r: %s" % (text, err))
    return text


def _namespace(text):
    import argparse
    from .names import normalize_namespace
    try:
        return normalize_namespace(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))


def _remap(text):
    import argparse
    from .names import parse_remap
    try:
        parse_remap(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))
    return text


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


# What rcl also takes in a --ros-args section, none of which ros_side honours on either backend:
# refused with the way to say it to ros_side (rcl's arguments.c; the ones with a value first).
_ROS_ARGS_WITH_VALUE = ("--params-file", "-e", "--enclave", "--log-level", "--log-file-name")
_ROS_FLAGS = ("--enable-rosout-logs", "--disable-rosout-logs", "--enable-stdout-logs",
              "--disable-stdout-logs", "--enable-external-lib-logs",
              "--disable-external-lib-logs")
_ROS_ARGS_INSTEAD = {"--params-file": "give the parameters as -p name:=value or as flags",
                     "--log-level": "use --log-level LEVEL before --ros-args",
                     "-e": "ros_side has no security enclaves",
                     "--enclave": "ros_side has no security enclaves"}


def ros_params_as_flags(argv):
    """The `--ros-args` sections as command-line flags, so every flag is also a ROS parameter and
    ROS's remapping works on both backends.

    `ros2 run ros_side ros_side --ros-args -p link:=udp://0.0.0.0:8269 -p baud:=921600` is
    `--link udp://0.0.0.0:8269 --baud 921600`; a boolean flag takes `name:=true`. `-r FROM:=TO`
    (`--remap`) is `--remap FROM:=TO` (`-r __ns:=/robot1`, `-r __node:=arm` included). Flags
    given on the command line itself come after these and win. Any other ROS argument is
    refused: a usage mistake (host_cli.Fatal, exit 2) naming it, rather than a setting that one
    backend would honour and the other silently not.
    """
    flags, in_ros, i = [], False, 0
    while i < len(argv):
        a = argv[i]
        if a == "--ros-args":
            in_ros = True
        elif a == "--":
            in_ros = False
        elif not in_ros:
            pass
        elif a in ("-p", "--param", "-r", "--remap"):
            if i + 1 >= len(argv) or argv[i + 1] in ("--", "--ros-args"):
                _ros_usage("--ros-args %s needs a value (%s)" % (
                    a, "name:=value" if a in ("-p", "--param") else "FROM:=TO"))
            value = argv[i + 1]
            i += 1
            if a in ("-r", "--remap"):
                flags += ["--remap", value]
            else:
                flags += _param_flag(value)
        elif a in _ROS_ARGS_WITH_VALUE or a.split("=", 1)[0] in _ROS_ARGS_WITH_VALUE \
                or a in _ROS_FLAGS:
            name = a.split("=", 1)[0]
            why = _ROS_ARGS_INSTEAD.get(name, "ros_side does not take it")
            _ros_usage("--ros-args %s is not supported (%s); ros_side takes -r/--remap "
                       "FROM:=TO and -p/--param name:=value there" % (name, why))
        else:
            _ros_usage("--ros-args: unknown ROS argument %r (ros_side takes -r/--remap FROM:=TO "
                       "and -p/--param name:=value; end the section with --)" % a)
        i += 1
    return flags


def _param_flag(text):
    name, sep, value = text.partition(":=")
    if not (sep and name and "." not in name and not name.startswith("use_sim_time")):
        return []
    flag = "--" + name.replace("_", "-")
    if value.lower() in ("true", "false"):
        return [flag] if value.lower() == "true" else []
    return [flag, value]


def _ros_usage(message):
    from ubrb_host.cli import EXIT_USAGE, Fatal
    raise Fatal(message, EXIT_USAGE)


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


def make_names(args):
    """The node's name, namespace and remap rules the flags ask for (names.Names)."""
    from .names import Names
    return Names(getattr(args, "node_name", "ros_side"), getattr(args, "namespace", "/"),
                 getattr(args, "remap", None) or ())


def hardware_id(args):
    """/diagnostics' hardware_id until the link says more (link_peer): this companion's link
    (`udp://0.0.0.0:8269`, `serial:/dev/ttyACM0`; direct mode: `tcp://HOST:PORT`, what it
    serves), what tells two companions apart."""
    if getattr(args, "listen", None):
        return "tcp://%s" % args.listen
    return getattr(args, "link", None) or "ubrb"


def link_peer(driver, url):
    """hardware_id as a function of the link: its peer, the hardware at the other end -- a UDP
    link's gateway address once it has spoken (`udp://192.168.1.20:40212`), else the link's own
    URL (a serial device is the peer: `serial:/dev/ttyACM0`)."""
    def peer():
        addr = getattr(getattr(driver, "t", None), "peer", None)
        if not addr:
            return url
        host, port = addr[0], addr[1]
        return "udp://%s:%d" % ("[%s]" % host if ":" in host else host, port)
    return peer


def make_companion(args, sink=None, max_message=64 * 1024 * 1024, **kw):
    names = make_names(args)
    backend = make_backend(args.backend, domain=args.domain, distro=args.ros_distro,
                           msg_paths=args.msg_path, node_name=names.node,
                           node_namespace=names.namespace)
    kw.setdefault("names", names)
    kw.setdefault("hardware_id", hardware_id(args))
    if args.no_diagnostics:
        kw["diagnostics_period_ms"] = 0
    if getattr(args, "max_history_bytes", None) is not None:
        kw["max_history_bytes"] = args.max_history_bytes
    return Companion(backend, sink, max_message, **kw)

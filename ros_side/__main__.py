"""``python -m ros_side`` / ``ros2 run ros_side ros_side`` — STUB: the lead wires the link and
direct mode here (see ARCHITECTURE.md "Command-line surface"); the ROS options and the
Companion construction are ready in ``ros_side.cli``."""

import argparse
import sys

from .cli import add_arguments, strip_ros_args


def main(argv=None):
    argv = strip_ros_args(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="ros_side", description="UBRB companion (ROS 2 side)")
    p.add_argument("--link", help="udp://HOST:PORT or serial:PATH")
    p.add_argument("--baud", type=int, default=None)
    p.add_argument("--listen", help="direct mode: HOST:PORT")
    add_arguments(p)
    p.parse_args(argv)
    sys.stderr.write("ros_side: the link/direct-mode loop is not wired yet\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())

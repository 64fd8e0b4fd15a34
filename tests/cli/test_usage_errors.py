"""Every value is checked when the command line is read: a mistake is one line on stderr that
says what is wrong and exit status 2, never a traceback, for every program."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest

from tests.cli.helpers import (CLIENT, COMPANION, DEMO, GATEWAY, LATENCY, OBSERVER, UNRESOLVABLE,
                               one_line, run, run_all)

PUB = CLIENT + ["pub", "/chatter", "std_msgs/msg/String"]
ECHO = CLIENT + ["echo", "/chatter", "std_msgs/msg/String"]

# (program + arguments, environment additions, what the one line must say)
CASES = [
    # -- ports and hosts ------------------------------------------------------------------------
    (GATEWAY + ["--link", "udp://127.0.0.1:99999"], {},
     ["ubrb_min.py: argument --link: port 99999", "expected 1-65535"]),
    (GATEWAY + ["--link", "udp://127.0.0.1:0"], {}, ["expected 1-65535"]),
    (GATEWAY + ["--listen", "127.0.0.1:99999"], {}, ["--listen: port must be 0-65535, got 99999"]),
    (GATEWAY + ["--listen", "nonsense"], {}, ["--listen: expected HOST:PORT, got 'nonsense'"]),
    (GATEWAY + ["--listen", UNRESOLVABLE + ":8268"], {},
     ["--listen: cannot resolve host 'no..such'"]),
    (GATEWAY + ["--link", "udp://%s:8269" % UNRESOLVABLE], {},
     ["--link: cannot resolve host 'no..such'"]),
    (GATEWAY + ["--link", "tcp://127.0.0.1:8269"], {},
     ["unknown link 'tcp://127.0.0.1:8269': use udp://HOST:PORT or serial:PATH"]),
    # an empty port is a mistake (a port left out, with its ':', is 8269: --help says so)
    (GATEWAY + ["--link", "udp://127.0.0.1:"], {},
     ["--link: 'udp://127.0.0.1:' has an empty port", "leave out the ':' for the default port "
      "8269"]),
    (COMPANION + ["--link", "udp://[::1]:"], {}, ["--link: 'udp://[::1]:' has an empty port"]),
    (GATEWAY + ["--link", "udp://99999"], {},
     ["--link: port 99999 in 'udp://99999' is out of range"]),
    (GATEWAY + ["--listen", "99999"], {}, ["--listen: port must be 0-65535, got 99999"]),
    (PUB + ["--server", ":"], {}, ["--server: expected HOST:PORT, got ':'"]),
    (PUB + ["--server", "127.0.0.1:"], {}, ["--server: expected HOST:PORT, got '127.0.0.1:'"]),
    (GATEWAY + ["--baud", "0"], {}, ["--baud: must be at least 1"]),
    (GATEWAY + ["--max-clients", "many"], {}, ["--max-clients: invalid int value: 'many'"]),
    (COMPANION + ["--link", "udp://127.0.0.1:99999"], {},
     ["python -m ros_side: argument --link: port 99999", "expected 1-65535"]),
    (COMPANION + ["--listen", "127.0.0.1:99999"], {}, ["--listen: port must be 0-65535"]),
    (COMPANION + ["--listen", "nonsense"], {}, ["--listen: expected HOST:PORT"]),
    (COMPANION + ["--listen", "127.0.0.1:0", "--link", "udp://127.0.0.1:8269"], {},
     ["choose --link (companion) or --listen (direct mode), not both"]),
    (PUB + ["--server", "127.0.0.1:99999"], {}, ["--server: port must be 1-65535, got 99999"]),
    (PUB + ["--server", UNRESOLVABLE + ":8268"], {}, ["--server: cannot resolve host 'no..such'"]),
    (DEMO + ["--ports", "99999"], {}, ["tools/demo.py: --ports: port must be 0-65535, got 99999"]),
    (DEMO + ["--ports", "8268,x"], {}, ["--ports expects GW[,LINK]"]),
    # -- ROS settings ---------------------------------------------------------------------------
    (COMPANION + ["--domain", "999"], {}, ["--domain: DDS domain must be 0-232, got 999"]),
    (COMPANION + ["--ros-args", "-p", "domain:=999"], {}, ["--domain: DDS domain must be 0-232"]),
    (CLIENT, {}, ["the following arguments are required"]),
    (COMPANION + ["--ros-distro", "bogus"], {},
     ["--ros-distro: no message definitions for ROS 2 distro 'bogus'", "humble"]),
    (COMPANION, {"ROS_DISTRO": "rolling"},
     ["ROS_DISTRO=rolling: no message definitions", "pass --ros-distro"]),
    (COMPANION, {"ROS_DOMAIN_ID": "abc"},
     ["ROS_DOMAIN_ID=abc: DDS domain must be a number 0-232", "pass --domain"]),
    (COMPANION, {"ROS_DOMAIN_ID": "300"}, ["ROS_DOMAIN_ID=300: DDS domain must be 0-232"]),
    (PUB + ["--distro", "bogus"], {}, ["--distro: no message definitions for ROS 2 distro"]),
    (DEMO + ["--domain", "999"], {}, ["--domain: DDS domain must be 0-232"]),
    (DEMO, {"ROS_DOMAIN_ID": "abc"}, ["ROS_DOMAIN_ID=abc"]),
    (LATENCY + ["--domain", "-1"], {}, ["--domain: DDS domain must be 0-232"]),
    (OBSERVER + ["echo", "--domain", "233"], {}, ["--domain: DDS domain must be 0-232"]),
    (OBSERVER + ["watch"], {"ROS_DOMAIN_ID": "x"}, ["ROS_DOMAIN_ID=x"]),
    (OBSERVER + ["echo", "--ros-distro", "bogus"], {}, ["--ros-distro: no message definitions"]),
    # -- issue 21 item 8: names, namespaces and remapping, the same on both backends ------------
    # (before: the dds backend silently ignored every one of these; the rclpy backend left them
    # to rcl, which took some and failed on others with a traceback)
    (COMPANION + ["--namespace", "/1robot"], {},
     ["argument --namespace: '/1robot': namespace must not have a token that starts with a "
      "number"]),
    (COMPANION + ["--namespace", "/robot1/"], {}, ["argument --namespace: '/robot1/': namespace "
                                                   "must not end with a '/'"]),
    (COMPANION + ["--node-name", "my-node"], {},
     ["argument --node-name: 'my-node': node name must not contain characters other than "
      "alphanumerics or '_'"]),
    (COMPANION + ["--remap", "/odom"], {}, ["argument --remap: '/odom': a remap rule is FROM:=TO"]),
    (COMPANION + ["--ros-args", "-r", "__ns:=robot1"], {},
     ["argument --remap: '__ns:=robot1': the namespace must be absolute"]),
    (COMPANION + ["--ros-args", "-r", "/odom/*:=/x"], {}, ["wildcards ('*', '**') are not "
                                                           "implemented by rcl either"]),
    (COMPANION + ["--ros-args", "-r"], {}, ["--ros-args -r needs a value (FROM:=TO)"]),
    (COMPANION + ["--ros-args", "--params-file", "p.yaml"], {},
     ["--ros-args --params-file is not supported (give the parameters as -p name:=value or as "
      "flags)"]),
    (COMPANION + ["--ros-args", "--log-level", "debug"], {},
     ["--ros-args --log-level is not supported (use --log-level LEVEL before --ros-args)"]),
    (COMPANION + ["--ros-args", "--enclave", "/e"], {}, ["--ros-args --enclave is not supported"]),
    (COMPANION + ["--ros-args", "--disable-rosout-logs"], {},
     ["--ros-args --disable-rosout-logs is not supported"]),
    (COMPANION + ["--ros-args", "--frobnicate"], {},
     ["--ros-args: unknown ROS argument '--frobnicate'"]),
    # -- durations and counts -------------------------------------------------------------------
    (COMPANION + ["--release-after", "-1"], {}, ["--release-after: seconds must be 0 or more"]),
    (DEMO + ["--duration", "-1"], {}, ["--duration: seconds must be 0 or more, got -1"]),
    (ECHO + ["--duration", "-1"], {}, ["--duration: seconds must be 0 or more"]),
    (PUB + ["--wait", "soon"], {}, ["--wait: expected seconds, got 'soon'"]),
    (PUB + ["--rate", "-5"], {}, ["--rate: rate must be 0 or more Hz"]),
    (CLIENT + ["bench", "--size", "8"], {}, ["--size: payload must be at least 16 bytes"]),
    (ECHO + ["--depth", "0"], {}, ["--depth: must be at least 1"]),
    (LATENCY + ["--count", "0"], {}, ["--count: must be at least 1"]),
    # -- what the parser cannot check: message type and fields ----------------------------------
    (PUB[:-1] + ["foo/Bar"], {}, ["pub: unknown message type foo/msg/Bar:", "--msg-path"]),
    (PUB + ["{nope: 1}"], {}, ["pub: ", "unknown field"]),
    (PUB + ["{a: [}"], {}, ["pub: DATA is not YAML/JSON"]),
    # numbers a field's type cannot hold: the field, its type and its range
    (CLIENT + ["pub", "/n", "std_msgs/msg/Int32", "{data: 99999999999}"], {},
     ["pub: data: 99999999999 is out of range for int32 (-2147483648 to 2147483647)"]),
    (CLIENT + ["pub", "/n", "std_msgs/msg/UInt8", "{data: -1}"], {},
     ["pub: data: -1 is out of range for uint8 (0 to 255)"]),
    (CLIENT + ["pub", "/n", "sensor_msgs/msg/Image", "{height: 1, width: 3, data: [1, 2, 300]}"],
     {}, ["pub: data[2]: 300 is out of range for uint8 (0 to 255)"]),
    (CLIENT + ["pub", "/n", "geometry_msgs/msg/PointStamped",
               "{header: {stamp: {sec: 4294967296}}}"], {},
     ["pub: header.stamp.sec: 4294967296 is out of range for int32"]),
    (CLIENT + ["pub", "/n", "std_msgs/msg/Float32", "{data: 1.0e+39}"], {},
     ["pub: data: 1e+39 is out of range for float32"]),
    # --msg-path names a directory of message packages, checked before any backend starts
    (COMPANION + ["--msg-path", "/nonexistent"], {},
     ["python -m ros_side: argument --msg-path: /nonexistent does not exist"]),
    (COMPANION + ["--msg-path", "README.md"], {},
     ["argument --msg-path: README.md is not a directory"]),
    (COMPANION + ["--ros-args", "-p", "msg_path:=/nonexistent"], {},
     ["argument --msg-path: /nonexistent does not exist"]),
    # -- issue 22 item 3: --link-mtu out of range is a usage mistake naming the range --------------
    (GATEWAY + ["--link-mtu", "10"], {},
     ["ubrb_min.py: argument --link-mtu: must be 64-65507 bytes", "got 10"]),
    (GATEWAY + ["--link-mtu", "100000"], {}, ["argument --link-mtu: must be 64-65507 bytes"]),
    (GATEWAY + ["--link-mtu", "big"], {}, ["argument --link-mtu: expected a whole number"]),
    (COMPANION + ["--link-mtu", "10"], {},
     ["python -m ros_side: argument --link-mtu: must be 64-65507 bytes", "got 10"]),
    (COMPANION + ["--ros-args", "-p", "link_mtu:=100000"], {},
     ["argument --link-mtu: must be 64-65507 bytes"]),
    # -- item 12: uart:ID is a board's UART; CPython names a device or a pyserial URL ------------
    (GATEWAY + ["--link", "uart:1"], {},
     ["argument --link: 'uart:1': uart:ID names a board UART (MicroPython); on CPython give "
      "serial:/dev/ttyXXX or a pyserial URL"]),
    (COMPANION + ["--link", "uart:1"], {}, ["uart:ID names a board UART (MicroPython)"]),
    (GATEWAY + ["--link", "serial:"], {},
     ["argument --link: serial: needs a device or pyserial URL, e.g. serial:/dev/ttyACM0"]),
    # -- item 11: a worst-case budget beyond this machine's RAM, naming the flag that made it big -
    (GATEWAY + ["--max-clients", "100000"], {},
     ["ubrb_min.py: --max-clients 100000: the worst-case memory budget, 1953.5 GiB, is more "
      "than this machine's RAM"]),
    (GATEWAY + ["--max-clients", "4", "--queue-bytes", str(10 ** 15)], {},
     ["--queue-bytes 1000000000000000: the worst-case memory budget"]),
    # both big: the queue cannot go back to the profile's value while the payload needs it
    (GATEWAY + ["--max-payload", str(2 ** 40), "--queue-bytes", str(2 ** 42)], {},
     ["--max-payload %d: the worst-case memory budget" % 2 ** 40]),
]


@pytest.fixture(scope="module")
def ran() -> Dict[str, Any]:
    """Every case's command line (helpers.run_all), by repr((argv, env))."""
    return dict(zip((repr((a, e)) for a, e, _ in CASES), run_all([(a, e) for a, e, _ in CASES])))


@pytest.mark.parametrize("argv,env,says", CASES,
                         ids=[" ".join(a[1:] if a[1] != "-m" else a[2:])[:70] + (
                             " " + " ".join("%s=%s" % kv for kv in e.items()) if e else "")
                             for a, e, _ in CASES])
def test_mistake_is_one_line_and_exit_2(ran: Dict[str, Any], argv: List[str],
                                        env: Dict[str, str], says: List[str]) -> None:
    line = one_line(ran[repr((argv, env))], 2, *says)
    if "pub: unknown message type" in line:
        assert "'" not in line.split("type", 1)[1].split(":")[0]  # no stray quotes on the name


def test_serial_suggestions_on_cpython_name_no_board_uart() -> None:
    # the grammar is shared with the board; on CPython its examples are CPython's
    for link in ("serial:", "tcp://127.0.0.1:1"):
        line = one_line(run(GATEWAY + ["--link", link]), 2)
        assert "serial:" in line and "uart" not in line, line


def test_budget_rule_is_the_whole_worst_case_against_ram() -> None:
    # cli.check_budget, with the machine's RAM given: the budget logged at start-up must fit
    import argparse

    import ubrb_setup
    from ubrb_host import cli

    def args(**given: int) -> argparse.Namespace:
        a = argparse.Namespace(profile="pi", **{k: None for k in ubrb_setup.PROFILE_KEYS})
        vars(a).update(given)
        return a

    p = ubrb_setup.make_profile("pi")
    total = ubrb_setup.memory_budget(p, ubrb_setup.link_sizes(p["max_payload"], True, 1400))["total"]
    cli.check_budget(args(), p, (True, 1400), ram=total)            # exactly fits
    with pytest.raises(cli.Fatal) as e:
        cli.check_budget(args(), p, (True, 1400), ram=total - 1)    # the profile itself: named
    assert e.value.code == 2 and str(e.value).startswith("--profile pi: the worst-case memory")
    big = ubrb_setup.make_profile("pi", {"max_clients": 40})
    with pytest.raises(cli.Fatal) as e:
        cli.check_budget(args(max_clients=40, max_pubs=8), big, None, ram=total)
    assert str(e.value).startswith("--max-clients 40: ")
    ram = cli.machine_memory()
    assert ram is not None and ram > 64 * ubrb_setup.MIB


def test_help_is_not_a_mistake() -> None:
    for argv in (GATEWAY, COMPANION, CLIENT, CLIENT + ["pub"], DEMO, LATENCY):
        r = run(argv + ["--help"])
        assert r.returncode == 0 and r.stdout.startswith("usage:"), (argv, r.stderr)


def test_usage_line_names_the_program_as_it_was_started() -> None:
    # ros2 run / the console script start it as `ros_side`: its messages say so, not `python -m`
    r = run([COMPANION[0], "-c", "import sys; sys.argv[0] = '/ws/install/lib/ros_side/ros_side';"
             " from ros_side.__main__ import main; sys.exit(main(['--domain', '999']))"])
    one_line(r, 2, "ros_side: argument --domain")
    assert "python -m" not in r.stderr

"""The companion's DDS history budget (--max-history-bytes), with the scripted backend: what a
registration reserves, the refusal, the release, and the flag's spellings. The same budget
through real processes: tests/e2e/test_e2e_policy.py."""

from ros_side.__main__ import build_parser
from ros_side.cli import make_companion, ros_params_as_flags
from ros_side.companion import Companion, default_history_bytes
from tests.support.fake_backend import FakeBackend
from tests.support.qos import QOS_R

MSG = 1000          # the companion's largest message in these tests


def budget_companion(sink, limit):
    return Companion(FakeBackend(), sink, max_message=MSG, diagnostics_period_ms=0,
                     max_history_bytes=limit)


def test_each_entity_reserves_depth_times_the_largest_message(sink):
    c = budget_companion(sink, 25 * MSG)
    c.advertise(1, "/a", "std_msgs/msg/String", dict(QOS_R, depth=10))
    c.subscribe(1, "/b", "std_msgs/msg/String", dict(QOS_R, depth=0))   # depth 0 is 1
    assert c.diagnostics()["history_bytes_reserved"] == 11 * MSG
    c.advertise(2, "/a", "std_msgs/msg/String", dict(QOS_R, depth=10))  # shares /a's writer
    assert c.history_used == 11 * MSG
    c.advertise(3, "/c", "std_msgs/msg/String", dict(QOS_R, depth=15))  # 26 > 25: refused
    assert sink.results()[-1] == ("pub", 3, "resource_exhausted")
    msg = sink.of("result")[-1][4]
    assert "--max-history-bytes 25000" in msg and "depth 15" in msg and "/c" in msg, msg
    assert len(c.backend.created) == 2 and c.history_used == 11 * MSG   # nothing created
    c.advertise(3, "/c", "std_msgs/msg/String", dict(QOS_R, depth=14))  # exactly fits
    assert sink.results()[-1] == ("pub", 3, None) and c.history_used == 25 * MSG


def test_the_reservation_ends_with_the_last_registration(sink):
    c = budget_companion(sink, 20 * MSG)
    c.advertise(1, "/a", "std_msgs/msg/String", dict(QOS_R, depth=20))
    c.advertise(2, "/a", "std_msgs/msg/String", dict(QOS_R, depth=20))
    c.unadvertise(1)
    assert c.history_used == 20 * MSG        # slot 2 still holds the writer
    c.unadvertise(2)
    assert c.history_used == 0
    c.subscribe(1, "/b", "std_msgs/msg/String", dict(QOS_R, depth=20))
    assert sink.results()[-1] == ("sub", 1, None)
    c.reset()                                # a new gateway epoch releases everything
    assert c.history_used == 0 and c.diagnostics()["history_bytes_limit"] == 20 * MSG


def test_the_flag_and_its_ros_parameter(sink):
    args = build_parser().parse_args(
        ros_params_as_flags(["--ros-args", "-p", "max_history_bytes:=512M"])
        + ["--backend", "dds"])
    assert args.max_history_bytes == 512 << 20
    assert build_parser().parse_args(["--max-history-bytes", "3G"]).max_history_bytes == 3 << 30
    assert build_parser().parse_args([]).max_history_bytes is None
    assert default_history_bytes() > 0
    args.no_diagnostics = True
    c = make_companion(args, sink, MSG)
    try:
        assert c.history_limit == 512 << 20
    finally:
        c.close()

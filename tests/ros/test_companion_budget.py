"""The companion's DDS history budget (--max-history-bytes), with the scripted backend: what the
histories hold, the refusal, the release, and the flag's spellings. The same budget through
real processes: tests/e2e/test_e2e_policy.py; direct mode's defaults: test_direct_defaults.py."""

from ros_side.__main__ import build_parser
from ros_side.cli import make_companion, ros_params_as_flags
from ros_side.companion import Companion, default_history_bytes
from tests.support.fake_backend import FakeBackend
from tests.support.qos import QOS_R

MSG = 1000          # the companion's largest message in these tests


def budget_companion(sink, limit):
    b = FakeBackend()
    b.resume_subscription = lambda h: None    # readers can be paused, as the dds backend's
    return Companion(b, sink, max_message=MSG, diagnostics_period_ms=0, max_history_bytes=limit)


def cdr(n, tag=b"x"):
    return b"\x00\x01\x00\x00" + tag * (n - 4)


def test_the_budget_counts_what_the_histories_hold(sink):
    """Issue 21, item 6: nothing is reserved at registration (before, depth x the largest
    message: in direct mode /tf depth 100 was 6.4 GiB); a writer holds its last depth samples."""
    c = budget_companion(sink, 25 * MSG)
    c.advertise(1, "/a", "std_msgs/msg/String", dict(QOS_R, depth=10))
    c.subscribe(1, "/b", "std_msgs/msg/String", dict(QOS_R, depth=0))   # depth 0 is 1
    c.advertise(2, "/deep", "std_msgs/msg/String", dict(QOS_R, depth=100000))
    assert sink.results() == [("pub", 1, None), ("sub", 1, None), ("pub", 2, None)]
    assert c.diagnostics()["history_bytes_reserved"] == 0
    for _ in range(12):                       # KEEP_LAST(10): the 11th replaces the 1st
        c.publish(1, cdr(MSG), 0, MSG, True)
    assert c.history_used == 10 * MSG
    c.publish(1, cdr(100), 0, 100, True)      # a small one replaces a large one
    assert c.history_used == 9 * MSG + 100
    c.backend.callbacks["/b"](cdr(MSG // 2))  # a reader: depth x its largest sample so far
    c.poll(0)
    assert c.history_used == 9 * MSG + 100 + MSG // 2
    c.subscribe(2, "/be", "std_msgs/msg/String", {"reliability": "best_effort", "depth": 100})
    c.backend.callbacks["/be"](cdr(MSG))      # never paused: taken at once, nothing held
    c.poll(1)
    assert c.history_used == 9 * MSG + 100 + MSG // 2
    assert sink.of("error") == []


def test_a_message_past_the_budget_is_refused_naming_the_flag(sink):
    c = budget_companion(sink, 25 * MSG)
    c.advertise(1, "/a", "std_msgs/msg/String", dict(QOS_R, depth=20))
    c.advertise(2, "/c", "std_msgs/msg/String", dict(QOS_R, depth=20))
    for _ in range(20):
        c.publish(1, cdr(MSG), 0, MSG, True)
    for _ in range(5):
        c.publish(2, cdr(MSG), 0, MSG, True)
    assert c.history_used == 25 * MSG and len(c.backend.published) == 25
    c.publish(2, cdr(MSG), 0, MSG, True)      # 26 > 25: not written
    c.publish(2, cdr(MSG), 0, MSG, True)      # refused again, reported once a second
    assert len(c.backend.published) == 25 and c.stats["history_drops"] == 2
    errors = sink.of("error")
    assert [e[1:4] for e in errors] == [("pub", 2, "resource_exhausted")], errors
    msg = errors[0][4]
    assert "--max-history-bytes 25000" in msg and "/c" in msg, msg
    assert "--max-message" not in msg and "--max-payload" not in msg, msg
    c.publish(1, cdr(MSG), 0, MSG, True)      # replaces one of /a's: still fits
    assert len(c.backend.published) == 26
    c.unadvertise(1)                          # /a's 20 samples are given back
    assert c.history_used == 5 * MSG
    c.publish(2, cdr(MSG), 0, MSG, True)
    assert len(c.backend.published) == 27


def test_a_reader_past_the_budget_is_not_paused(sink):
    """A paused reader's DDS history holds depth samples: beyond the budget the reader is not
    paused (its overflow is dropped, as a best-effort one's), so DDS holds no more for it."""
    c = budget_companion(sink, 10 * MSG)
    b = c.backend
    c.subscribe(1, "/small", "std_msgs/msg/String", dict(QOS_R, depth=5))
    c.subscribe(2, "/big", "std_msgs/msg/String", dict(QOS_R, depth=100))
    b.callbacks["/small"](cdr(MSG))
    b.callbacks["/big"](cdr(MSG))
    c.poll(0)
    assert c.history_used == 5 * MSG          # /big's 100 x MSG does not fit: not charged
    big = c._subs["/big"]
    assert big.pause_ok is False and c._subs["/small"].pause_ok is True
    assert len(sink.messages(2)) == 1         # delivered all the same


def test_the_reservation_ends_with_the_last_registration(sink):
    c = budget_companion(sink, 20 * MSG)
    c.advertise(1, "/a", "std_msgs/msg/String", dict(QOS_R, depth=20))
    c.advertise(2, "/a", "std_msgs/msg/String", dict(QOS_R, depth=20))
    for _ in range(20):
        c.publish(2, cdr(MSG), 0, MSG, True)
    c.unadvertise(1)
    assert c.history_used == 20 * MSG        # slot 2 still holds the writer
    c.unadvertise(2)
    assert c.history_used == 0
    c.subscribe(1, "/b", "std_msgs/msg/String", dict(QOS_R, depth=20))
    c.backend.callbacks["/b"](cdr(MSG))
    c.poll(0)
    assert c.history_used == 20 * MSG
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

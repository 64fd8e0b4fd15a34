# A hostile client against the gateway core: what it logs about a client (every client-supplied
# string as a repr, so one record is one line whatever the client sends; repeated warnings at
# most once a second with a count of those held back), and JSON nested deep enough to exhaust a
# parser. Runs under CPython (pytest) and MicroPython alike.
import ubrb_min as U
from scripted import Client, ScriptedRos, profile
from tests.support.ubrb_frames import advertise, hello


def logged_gateway():
    lines = []
    ros = ScriptedRos()
    gw = U.Gateway(profile(), ros=ros, log=lambda level, msg: lines.append((level, msg)))
    ros.up()
    return gw, lines


def test_a_newline_in_a_client_name_stays_on_one_log_line():
    gw, lines = logged_gateway()
    c = Client(gw)
    c.send(hello("ue\nCRITICAL root: forged"))
    c.send(advertise(1, "/a\n\rCRITICAL forged too", "std_msgs/msg/String"), now=10)
    c.send(advertise(1, "/b", "other/msg/T"), now=20)   # duplicate_id: the message names /b
    c.close()
    assert lines, "the gateway logged nothing"
    for _, msg in lines:
        assert "\n" not in msg and "\r" not in msg, msg
    assert any("'ue\\nCRITICAL root: forged'" in m for _, m in lines)


def test_repeated_client_errors_are_logged_once_a_second_with_a_count():
    gw, lines = logged_gateway()
    c = Client(gw)
    c.send(hello("x"))
    for k in range(100):
        c.send(b"UBRB\x01\x05\x00\x00\x00\x00\x00\x00", now=k)  # PUBLISH without its id
        c.frames()  # a client that reads its ERRORs (one that does not is not even logged)
    warned = [m for lvl, m in lines if lvl == "warning"]
    assert len(warned) == 1 and "protocol_error" in warned[0]
    c.send(b"UBRB\x01\x05\x00\x00\x00\x00\x00\x00", now=1500)
    warned = [m for lvl, m in lines if lvl == "warning"]
    assert len(warned) == 2 and "(99 similar suppressed)" in warned[1]


def test_deeply_nested_client_json_is_a_protocol_error_not_a_crash():
    gw, lines = logged_gateway()
    c = Client(gw)
    c.send(hello("deep"))
    c.send(U.encode_frame(U.OP_ADVERTISE, b"[" * 250 + b"]" * 250))   # within max_control
    errs = c.json_frames(U.OP_ERROR)
    assert errs[-1]["code"] == "protocol_error" and "deeper" in errs[-1]["message"]
    assert not c.closing()

# What the gateway core logs about a client: every client-supplied string as a repr (one record
# is one line, whatever the client sends), and repeated warnings at most once a second with a
# count of those held back. Runs under CPython (pytest) and MicroPython alike.
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
        c.send(b"UBRB\x01\x05\x00\x00\x00\x00\x00\x00", now=k)  # UNADVERTISE, empty: bad JSON
    warned = [m for lvl, m in lines if lvl == "warning"]
    assert len(warned) == 1 and "protocol_error" in warned[0]
    c.send(b"UBRB\x01\x05\x00\x00\x00\x00\x00\x00", now=1500)
    warned = [m for lvl, m in lines if lvl == "warning"]
    assert len(warned) == 2 and "(99 similar suppressed)" in warned[1]

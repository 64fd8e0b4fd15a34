# The MicroPython port's loop contains any unexpected exception per event: logged (rate-limited,
# one line), that event dropped, the client it came from closed, everyone else served. Runs on the
# port's own fakes under CPython (pytest) and real MicroPython (tests/mp/run.mjs) alike.
import ubrb_min as U
from tests.support.mp_rig import Rig, frames
from tests.support.qos import QOS_R
from tests.support.ubrb_frames import advertise, hello, ping, publish


def boom(*args):
    raise KeyError("a bug somewhere below the loop")


def test_an_exception_serving_one_client_closes_only_that_client():
    rig = Rig()
    rig.up()
    a = rig.connect()
    b = rig.connect()
    a.send(hello("a") + advertise(1, "/chatter", "std_msgs/msg/String", QOS_R))
    b.send(hello("b"))
    rig.run(100)
    frames(a)
    frames(b)
    rig.ros.publish = boom                     # the next PUBLISH raises inside the core
    a.send(publish(1, b"\x00\x01\x00\x00x") * 5)
    rig.run(100)
    b.send(ping())
    rig.run(50)
    assert [f[0] for f in frames(b)] == [U.OP_PONG]
    errors = [m for lvl, m in rig.logged if lvl == "error"]
    assert len(errors) == 1 and "unexpected error in client" in errors[0] and "KeyError" in errors[0]
    assert "\n" not in errors[0]
    assert rig.gw.active_clients() == 1      # a was closed, b is served


def test_an_exception_in_the_timers_is_contained_and_logged_once_a_second():
    rig = Rig()
    rig.up()
    real = rig.gw.tick
    rig.gw.tick = boom
    rig.run(500)                               # 50 failing steps
    rig.gw.tick = real
    c = rig.connect()
    c.send(hello("after") + ping())
    rig.run(50)
    assert [f[0] for f in frames(c)] == [U.OP_HELLO_ACK, U.OP_PONG]
    errors = [m for lvl, m in rig.logged if lvl == "error"]
    assert len(errors) == 1 and "timers" in errors[0]

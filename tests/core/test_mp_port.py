# The MicroPython port (ports/micropython: gateway.py, loop.py, link.py) on thin fakes of socket, time and
# machine (tests/core/mp_fakes.py). Under MicroPython the real select.poll()/ipoll() polls the
# fakes; the link runs the real LinkSession at both ends. Runs under CPython (pytest) and real
# MicroPython (tests/mp/run.mjs) alike.
import gc
import json
import sys

import ubrb_min as U
import ubrb_setup
import mp_fakes as F
from scripted import ScriptedRos
from tests.support.mp_rig import COMPANION, LK, ML, PORT, G, Rig, frames
from tests.support.qos import QOS_BE, QOS_R
from tests.support.ubrb_frames import advertise, hello, parse_frames, ping, publish, subscribe

MICROPYTHON_ONLY = {
    "test_launcher_lands_in_this_port_without_a_second_core",
    "test_client_relay_through_the_port_allocates_nothing",
    "test_link_relay_allocation_per_message",
}

def ci_of(rig, client):
    for ci in range(len(rig.loop.socks)):
        if rig.loop.socks[ci] is client.peer:
            return ci
    return -1


# ---------------------------------------------------------------------------------------------
# options
# ---------------------------------------------------------------------------------------------
def test_flags_like_the_cpython_port():
    o = G.parse_args(["--listen", "0.0.0.0:9000", "--link=uart:1", "--baud", "921600",
                      "--tx", "17", "--rx", "16", "--max-clients", "3", "--log-level", "debug"])
    assert o["listen"] == "0.0.0.0:9000"
    assert o["link"] == "uart:1"
    assert o["baud"] == 921600 and o["tx"] == 17 and o["rx"] == 16
    assert o["max_clients"] == 3 and o["max_pubs"] is None
    assert o["profile"] == "mcu"  # the default on a microcontroller
    assert G.parse_args(["--help"]) is None
    for bad in (["--bogus", "1"], ["--baud", "fast"], ["--listen"], ["stray"]):
        try:
            G.parse_args(bad)
        except ValueError:
            pass
        else:
            raise AssertionError(bad)
    p = G.profile_from(o)
    assert p["max_clients"] == 3 and p["max_payload"] == ubrb_setup.PROFILES["mcu"]["max_payload"]


def test_options_from_a_dict_and_config_py():
    class Config:
        WIFI_SSID = "lab"
        WIFI_PASSWORD = "secret"
        GATEWAY = {"link": "udp://10.0.0.2:8269", "max_clients": 1, "baud": 57600}

    io = ML.IO(None, None, None, None, None, Config)
    o = G.options({"max_clients": 2, "link-mtu": 1200}, io)
    assert o["link"] == "udp://10.0.0.2:8269"  # from config.GATEWAY
    assert o["max_clients"] == 2  # the dict passed to main() wins
    assert o["link_mtu"] == 1200 and o["baud"] == 57600
    assert G.options(["--baud", "9600"], io)["baud"] == 9600
    try:
        G.options({"wifi": "x"}, io)
    except ValueError:
        pass
    else:
        raise AssertionError("no error")
    io.config = None
    text = G.usage()
    for flag in ("--listen", "--link", "--baud", "--tx", "--rx", "--profile", "--max-clients",
                 "--queue-bytes", "--wifi-ssid", "--link-key", "--insecure-link",
                 "mcu: max_clients=2"):
        assert flag in text, flag
    assert G.main(["--profile", "huge"], io) == 2
    assert G.main({"max_payload": 1 << 20}, io) == 2  # queue_bytes cannot hold it


def test_launcher_lands_in_this_port_without_a_second_core():
    # `micropython ubrb_min.py --max-clients many`: the file runs as __main__ (exec'd here with
    # that name); its launcher hands over to this port, which refuses the bad flag before any
    # I/O, and the __main__ copy never defines the core (the port uses `ubrb_min`, loaded once).
    import sys

    with open(U.__file__) as f:
        source = f.read()
    saved = list(sys.argv)
    sys.argv.clear()
    sys.argv.extend(["ubrb_min.py", "--max-clients", "many"])
    g = {"__name__": "__main__", "__file__": U.__file__}
    try:
        exec(source, g)
    except SystemExit as e:
        code = e.args[0] if e.args else 0
    else:
        raise AssertionError("the launcher did not exit")
    finally:
        sys.argv.clear()
        sys.argv.extend(saved)
    assert code == 2
    assert "ports.micropython.run" in sys.modules
    assert "Gateway" not in g and "LinkSession" not in g


def test_link_urls():
    # The core's grammar, as this port reads it: serial:ID and uart:ID name a UART by number.
    assert ubrb_setup.parse_link_url("udp://192.0.2.10:8269") == ("udp", "192.0.2.10", 8269)
    assert ubrb_setup.parse_link_url("udp://192.0.2.10") == ("udp", "192.0.2.10", 8269)
    assert ubrb_setup.parse_link_url("uart:1") == ("serial", "1", 0)
    assert ubrb_setup.parse_link_url("serial:2") == ("serial", "2", 0)
    assert G.uart_id("2") == 2
    assert ubrb_setup.parse_link_url("none")[0] == "none"
    # a number alone is a port on this machine, never a host (udp://8269 is not 0.0.32.77); a
    # port left out is 8269, an empty one after ':' a mistake
    assert ubrb_setup.parse_link_url("udp://8269") == ("udp", "127.0.0.1", 8269)
    assert ubrb_setup.parse_link_url("udp://:9000/") == ("udp", "127.0.0.1", 9000)
    assert ubrb_setup.parse_link_url("udp://[::1]") == ("udp", "::1", 8269)
    for bad in ("udp://", "tcp://a:1", "udp://h:p", "serial:", "udp://127.0.0.1:", "udp://[::1]:",
                "udp://99999", "udp://[::1]x"):
        try:
            ubrb_setup.parse_link_url(bad)
        except ValueError:
            pass
        else:
            raise AssertionError(bad)
    try:
        G.uart_id("x")
    except ValueError:
        pass
    else:
        raise AssertionError("uart:x accepted")
    e = LK.new_epoch(F.FakeTime(5))
    assert 0 < e < (1 << 30)


def _refusal(fn, *args):
    """The ValueError's line of fn(*args) (AssertionError when there is none)."""
    try:
        fn(*args)
    except ValueError as e:
        return str(e)
    raise AssertionError("accepted: %r" % (args,))


def test_link_mtu_range_and_each_runtimes_serial_words():
    # issue 22 items 3 and 12: one range for every port and the companion; the shared grammar
    # suggests a board's uart:ID on a board (and to tools/deploy.py), a device on CPython
    assert ubrb_setup.check_link_mtu(64) == 64 and ubrb_setup.check_link_mtu(65507) == 65507
    for bad in (10, 63, 65508, 100000, None):
        assert "must be 64-65507 bytes" in _refusal(ubrb_setup.check_link_mtu, bad)
    board = _refusal(ubrb_setup.parse_link_url, "serial:", True)
    assert "a UART number, e.g. uart:1" in board
    host = _refusal(ubrb_setup.parse_link_url, "serial:", False)
    assert "serial:/dev/ttyACM0" in host and "uart" not in host
    assert "udp://HOST:PORT or uart:ID" in _refusal(ubrb_setup.parse_link_url, "tcp://x", True)
    assert "or serial:PATH" in _refusal(ubrb_setup.parse_link_url, "tcp://x", False)
    mp = sys.implementation.name == "micropython"
    assert ("uart:1" in _refusal(ubrb_setup.parse_link_url, "uart:")) == mp  # this runtime's


def test_the_flag_that_makes_the_budget_big_is_named():
    # issue 22 item 11: of the limits given, the one whose profile value lowers the budget most
    none = {}
    for k in ubrb_setup.PROFILE_KEYS:
        none[k] = None
    assert ubrb_setup.budget_culprit("mcu", none) == "--profile mcu"
    over = dict(none)
    over["max_clients"] = 100000
    over["max_pubs"] = 4
    assert ubrb_setup.budget_culprit("mcu", over, (True, 1400)) == "--max-clients 100000"
    over = dict(none)
    over["max_clients"] = 3
    over["queue_bytes"] = 1 << 30
    assert ubrb_setup.budget_culprit("pi", over) == "--queue-bytes %d" % (1 << 30)
    assert ubrb_setup.human_bytes(3 << 30) == "3.0 GiB"


def test_the_boards_option_checks_need_no_board():
    # check_options: what the board checks before Wi-Fi and any buffer, and tools/deploy.py
    # before it builds (issue 22 item 9)
    def opts(**given):
        o = G.defaults()
        o.update(given)
        return o

    o = opts(link="udp://192.0.2.10", insecure_link=1)
    profile = G.check_options(o)
    assert profile["max_clients"] == 2 and o["link_port"] == 8269 and o["budget_fix"] == "--profile mcu"
    assert o["budget"] == ubrb_setup.memory_budget(profile, o["sizes"])["total"]
    assert "--link-mtu must be 64-65507" in _refusal(G.check_options, opts(link_mtu=10))
    assert "not a loopback address" in _refusal(G.check_options, opts(link="udp://192.0.2.10"))
    assert "udp://HOST:PORT or uart:ID" in _refusal(G.check_options, opts(link="tcp://x"))
    assert "needs a UART number" in _refusal(G.check_options, opts(link="serial:/dev/ttyUSB0"))
    G.check_options(opts(link="udp://192.0.2.10", link_key="link.key"))  # the file is the board's


def test_listen_addresses():
    # The grammar of every HOST:PORT option of both ports (ubrb_setup.parse_hostport): a PORT
    # alone, or :PORT, is 127.0.0.1 (0.0.0.0 only when written: every interface).
    hp = ubrb_setup.parse_hostport
    assert hp("0.0.0.0:9000") == ("0.0.0.0", 9000)
    assert hp("8268") == ("127.0.0.1", 8268)
    assert hp(":8268") == ("127.0.0.1", 8268)
    assert hp("[::1]:8268") == ("::1", 8268)
    assert hp("0", True) == ("127.0.0.1", 0)
    for bad, says in (("nonsense", "expected HOST:PORT"), ("host:", "expected HOST:PORT"),
                      ("host:x", "port must be a number"), ("0", "port must be 1-65535"),
                      ("70000", "port must be 1-65535, got 70000"), ("[::1]8", "[IPv6]:PORT")):
        try:
            hp(bad)
        except ValueError as e:
            assert says in str(e), (bad, str(e))
        else:
            raise AssertionError(bad)
    # the board's start-up reads --listen with it
    o = G.parse_args(["--listen", "9000"])
    io = ML.IO(None, None, None, None, None, None)
    G.prepare(o, io, ML.Log("error"))
    assert o["listen_addr"] == ("127.0.0.1", 9000)


# ---------------------------------------------------------------------------------------------
# start-up, clients, the link
# ---------------------------------------------------------------------------------------------
def test_startup_prints_the_budget_and_waits_for_the_link():
    rig = Rig()
    text = "\n".join(m for lv, m in rig.logged)
    assert "profile mcu: worst-case memory budget" in text
    assert "link session buffers" in text
    assert "listening on 0.0.0.0:8268, link udp://10.0.0.2:8269" in text
    assert rig.loop.lsock.addr == ("0.0.0.0", PORT)
    assert rig.drv.t.sock.peer == COMPANION  # the UDP socket is connected to the companion
    rig.up()
    assert rig.gw.ros_distro == "humble"
    assert rig.now() < 1000


def test_clients_are_served_at_once_and_their_reliable_data_waits_3_s_for_the_link():
    # Issue 22 item 19: the connection is accepted and HELLO answered at once (its deadline runs
    # from the connect); a reliable PUBLISH waits for the link for the link's dead timer + 4
    # HELLO intervals (a restarted gateway's companion answers once its old session has timed
    # out), as in the CPython port, then is dropped as at any time the link is down.
    rig = Rig(companion=False)
    c = rig.connect()
    c.send(hello("ue") + advertise(1, "/chatter", "std_msgs/msg/String", QOS_R)
           + publish(1, b"\x00\x01\x00\x00held") + ping())
    rig.step()
    got = frames(c)
    assert [op for op, _ in got] == [U.OP_HELLO_ACK]  # the PING waits behind the held PUBLISH
    assert json.loads(got[0][1])["ros_ready"] is False
    rig.run(2800)
    assert frames(c) == [] and rig.gw.counters()["dropped_no_ros"] == 0
    rig.run(300)
    assert [op for op, _ in frames(c)] == [U.OP_PONG]
    assert rig.gw.counters()["dropped_no_ros"] == 1 and not rig.gw.ros_ready
    assert rig.drv.s.counters()["hello_tx"] >= 12  # HELLO every 250 ms from the injected clock


def test_a_publish_held_at_start_up_reaches_the_companion_once_the_link_is_up():
    rig = Rig()
    c = rig.connect()
    c.send(hello("ue") + advertise(1, "/chatter", "std_msgs/msg/String", QOS_R)
           + publish(1, b"\x00\x01\x00\x00early"))
    rig.step()
    assert not rig.gw.ros_ready and [op for op, _ in frames(c)] == [U.OP_HELLO_ACK]
    rig.up()
    rig.run(100)
    calls = [k for k in rig.comp.ros.calls if k[0] in ("advertise", "publish")]
    assert calls == [("advertise", 0, "/chatter", "std_msgs/msg/String"),
                     ("publish", 0, b"\x00\x01\x00\x00early", True)], calls
    assert rig.gw.counters()["dropped_no_ros"] == 0


def test_hello_advertise_publish_reach_the_companion():
    rig = Rig()
    rig.up()
    c = rig.connect()
    c.send(hello("ue") + advertise(1, "/chatter", "std_msgs/msg/String", QOS_R)
           + publish(1, b"\x00\x01\x00\x00hello"))
    rig.run(100)
    got = frames(c)
    assert got[0][0] == U.OP_HELLO_ACK
    ack = json.loads(got[0][1])
    assert ack["protocol"] == 1 and ack["ros_distro"] == "humble"
    calls = rig.comp.ros.calls
    assert ("advertise", 0, "/chatter", "std_msgs/msg/String") in calls
    assert ("publish", 0, b"\x00\x01\x00\x00hello", True) in calls
    assert rig.gw.counters()["publish_in"] == 1


def test_message_from_the_companion_reaches_the_client():
    rig = Rig()
    rig.up()
    c = rig.connect()
    c.send(hello() + subscribe(4, "/odom", "nav_msgs/msg/Odometry", QOS_BE))
    rig.run(100)
    frames(c)
    assert ("subscribe", 0, "/odom", "nav_msgs/msg/Odometry") in rig.comp.ros.calls
    data = bytes(range(200))
    rig.comp.end.ros_message(0, data, 0, len(data))  # a ROS message on sub slot 0
    rig.run(50)
    got = frames(c)
    assert len(got) == 1 and got[0][0] == U.OP_MESSAGE
    assert U.get_u32(got[0][1], 0) == 4 and got[0][1][4:] == data


KEY_HEX = "00112233445566778899aabbccddeeff" * 2


_key_files = [0]


class KeyFile:
    """`with KeyFile(text) as path:` a link key file of this test alone, removed after it. On
    CPython a new temp file (mkstemp: a name no one else has, mode 0600); under MicroPython (the
    instance's own in-memory file system, no tempfile) a fresh name in its cwd."""

    def __init__(self, text=KEY_HEX + "\n"):
        self.text = text
        self.path = None

    def __enter__(self):
        try:
            import tempfile
        except ImportError:  # MicroPython
            _key_files[0] += 1
            self.path = "link-%d.key" % _key_files[0]
            with open(self.path, "w") as f:
                f.write(self.text)
            return self.path
        import os

        fd, self.path = tempfile.mkstemp(prefix="ubrb-test-", suffix=".key")
        os.write(fd, self.text.encode())
        os.close(fd)
        return self.path

    def __exit__(self, *exc):
        import os

        try:
            os.remove(self.path)
        except OSError:
            pass
        return False


def test_key_files_are_each_tests_own_and_removed_after():
    import os

    with KeyFile() as a:
        with KeyFile("x") as b:
            assert a != b
            with open(a) as f:
                assert f.read() == KEY_HEX + "\n"
            try:
                import tempfile  # noqa: F401  (CPython: a real temp dir others can see)
            except ImportError:
                pass
            else:
                assert os.stat(a)[0] & 0o077 == 0 and os.stat(b)[0] & 0o077 == 0
    for path in (a, b):
        try:
            open(path).close()
        except OSError:
            pass
        else:
            raise AssertionError(path + " left behind")


def test_keyed_link_options():
    o = G.parse_args(["--link-key", "/k", "--insecure-link", "--baud", "9600"])
    assert o["link_key"] == "/k" and o["insecure_link"] == 1 and o["baud"] == 9600
    assert G.parse_args([])["insecure_link"] == 0
    assert G.apply_dict(G.defaults(), {"insecure_link": True})["insecure_link"] == 1
    # unkeyed UDP to another host: refused, with the way out in the sentence
    for link in ("udp://10.0.0.2:8269", "udp://192.0.2.10"):
        try:
            Rig(link=link, insecure_link=0)
        except ValueError as e:
            assert "--link-key" in str(e) and "--insecure-link" in str(e)
        else:
            raise AssertionError(link)
    rig = Rig(link="udp://10.0.0.2:8269", insecure_link=1)
    assert any(lv == "warning" and "no key" in m for lv, m in rig.logged)
    for text in ("abc", "zz" * 20):
        with KeyFile(text) as path:
            try:
                Rig(link_key=path, comp_key=b"x" * 16)
            except ValueError as e:
                assert "link key" in str(e)
            else:
                raise AssertionError(text)


def test_keyed_udp_and_uart_links_carry_data():
    key = ubrb_setup.parse_link_key(KEY_HEX)
    with KeyFile() as path:
        for link in ("udp://10.0.0.2:8269", "uart:1"):
            rig = Rig(link=link, link_key=path, comp_key=key, insecure_link=0)
            rig.up()
            assert rig.drv.s.tag == U.LK_TAG
            c = rig.connect()
            c.send(hello("ue") + advertise(1, "/chatter", "std_msgs/msg/String", QOS_R)
                   + subscribe(4, "/odom", "nav_msgs/msg/Odometry", QOS_R)
                   + publish(1, b"\x00\x01\x00\x00hello"))
            rig.run(200)
            frames(c)
            assert ("publish", 0, b"\x00\x01\x00\x00hello", True) in rig.comp.ros.calls, link
            rig.comp.end.ros_message(0, b"odom", 0, 4)
            rig.run(100)
            got = frames(c)
            assert [(op, p[4:]) for op, p in got] == [(U.OP_MESSAGE, b"odom")], link
            assert rig.drv.s.counters()["auth"] == 0 and rig.comp.s.counters()["auth"] == 0
        # a companion with another key never gets a session
        rig = Rig(link_key=path, comp_key=bytes(32), insecure_link=0)
        rig.run(1000)
        assert not rig.gw.ros_ready and rig.drv.s.counters()["auth"] > 0


def test_a_large_frame_split_over_many_reads():
    rig = Rig()
    rig.up()
    c = rig.connect()
    c.send(hello() + advertise(2, "/img", "sensor_msgs/msg/Image", QOS_R))
    rig.run(50)
    frames(c)
    data = bytes(i & 0xFF for i in range(1800))
    f = publish(2, data)
    for o in range(0, len(f), 100):  # 100-byte pieces: each read continues a partial frame
        c.send(f[o:o + 100])
        rig.step()
    rig.run(200)
    assert rig.comp.ros.last_len == 1800 and bytes(rig.comp.ros.last[:1800]) == data


def test_the_clock_survives_the_ticks_wrap():
    clock = ML.Clock(F.FakeTime(F.TICKS_MASK - 5))
    t = clock.t
    t.advance(3)
    assert clock.ms() == 3
    t.advance(10)  # ticks wrap to 7
    assert t.ticks_ms() == 7
    assert clock.ms() == 13
    # the gateway's timers run on it: a client that never says HELLO is closed 5 s after its
    # accept, across a wrap in the middle
    rig = Rig(ticks=F.TICKS_MASK - 2500)
    rig.up()
    c = rig.connect()
    rig.run(4800)
    assert not c.peer_closed
    rig.run(300)
    got = frames(c)
    assert c.peer_closed
    assert got[-1][0] == U.OP_ERROR and json.loads(got[-1][1])["code"] == "hello_required"
    assert rig.time.ticks_ms() < 10000  # the ticks did wrap
    assert rig.gw.ros_ready  # and the link's heartbeats and timers kept it up throughout


def test_a_long_uptime_keeps_every_time_a_small_int():
    # Days of uptime in a few steps: move every stored time forward to just below the point
    # where the loop rebases (a negative rebase is a shift forward), then run across it.
    rig = Rig()
    rig.up()
    c = rig.connect()
    c.send(hello() + advertise(1, "/chatter", "std_msgs/msg/String", QOS_R))
    quiet = rig.connect()  # connects but never says HELLO: closed 5 s after its accept
    rig.run(100)
    frames(c)
    jump = ML.REBASE_AT - 3000 - rig.now()
    rig.loop.rebase(-jump)
    rig.comp.s.rebase(-jump)
    # The companion keeps its own continuous clock: the gateway's moves back under it.
    offset = [0]
    last = [rig.now()]

    def step():
        rig.time.advance(10)
        rig.loop.step()
        if rig.now() < last[0]:
            offset[0] += ML.REBASE_STEP
        last[0] = rig.now()
        rig.comp.pump(rig.now() + offset[0])

    for i in range(600):  # 6 s: crosses REBASE_AT about 3 s in
        step()
        if i % 100 == 0:
            c.send(U.encode_frame(U.OP_PING, b""))  # keep the HELLO'd client alive
        if i == 400:  # 4 s after its accept, 1 s after the rebase: not yet
            assert not quiet.peer_closed
    assert offset[0] == ML.REBASE_STEP, "the loop did not rebase"
    assert rig.now() < ML.REBASE_AT
    assert rig.gw.ros_ready  # the link never noticed
    assert quiet.peer_closed  # its 5 s HELLO deadline ran across the rebase
    assert not c.peer_closed
    c.send(publish(1, b"\x00\x01\x00\x00after"))
    for _ in range(20):
        step()
    assert ("publish", 0, b"\x00\x01\x00\x00after", True) in rig.comp.ros.calls
    s = rig.ros.s
    for t in (s.now, s.hello_at, s.last_rx, s.last_tx, s.reliable.go_back_at, s.reliable.rack_at, s.reader.frag_started_at) + tuple(s.reliable.frame_sent_at):
        assert t < ML.REBASE_AT
    for cl in rig.gw.clients:
        assert cl.accepted_ms < ML.REBASE_AT and cl.last_rx_ms < ML.REBASE_AT


def test_a_client_that_vanishes_is_released():
    rig = Rig()
    rig.up()
    c = rig.connect()
    c.send(hello() + advertise(1, "/scan", "sensor_msgs/msg/LaserScan", QOS_BE))
    rig.run(50)
    ci = ci_of(rig, c)
    assert ci >= 0 and rig.gw.clients[ci].state == U.S_READY
    conn = c.peer
    conn.hup = True  # the stack reports a hang-up; no EOF was read
    rig.run(50)
    assert rig.loop.socks[ci] is None and conn.closed
    assert rig.gw.clients[ci].state == U.S_FREE
    assert ("unadvertise", 0) in rig.comp.ros.calls  # its registration was released
    assert rig.gw.pubs.used() == 0
    # an orderly close (EOF) and a reset are released too
    c2 = rig.connect()
    c2.send(hello())
    rig.run(20)
    c2.close()
    c3 = rig.connect()
    c3.peer.err = True
    rig.run(20)
    assert rig.gw.active_clients() == 0
    assert rig.loop.socks == [None, None]
    assert "closed by client" in "\n".join(m for lv, m in rig.logged)


def test_too_many_clients_are_refused():
    rig = Rig()
    rig.up()
    a = rig.connect()
    b = rig.connect()
    c = rig.connect()
    rig.run(20)
    got = frames(c)
    assert c.peer_closed and got[0][0] == U.OP_ERROR
    assert json.loads(got[0][1])["code"] == "too_many_clients"
    assert not a.peer_closed and not b.peer_closed


def test_a_new_connection_gets_the_slot_of_a_client_closed_with_nothing_left_to_send():
    # mcu: 2 slots. A client closed for saying nothing for 10 s has no frame left to flush, so
    # its socket is closed at the latest 2 s later; a connection that comes meanwhile finds no
    # free slot: the port closes that client first instead of refusing the newcomer.
    rig = Rig()
    rig.up()
    a = rig.connect()
    a.send(hello())
    b = rig.connect()
    b.send(hello())
    rig.run(50)
    ia = ci_of(rig, a)
    for _ in range(120):  # b pings every 100 ms, a is silent
        if rig.gw.wants_close(ia):
            break
        b.send(ping())
        rig.run(100)
    assert rig.gw.wants_close(ia) and rig.loop.socks[ia] is a.peer  # closing, not yet closed
    frames(a)
    c = rig.connect()
    assert not c.peer_closed, frames(c)  # not refused with too_many_clients
    c.send(hello())
    rig.run(20)
    assert [op for op, _ in frames(c)] == [U.OP_HELLO_ACK]
    assert a.peer_closed and not b.peer_closed
    assert rig.gw.counters()["clients_rejected"] == 0


def test_a_slow_client_is_written_as_it_reads():
    rig = Rig()
    rig.up()
    c = rig.connect(cap=256)  # the client's receive window: 256 bytes
    c.send(hello() + subscribe(4, "/odom", "nav_msgs/msg/Odometry", QOS_R))
    rig.run(50)
    frames(c)
    ci = ci_of(rig, c)
    data = bytes(100)
    for _ in range(10):
        rig.comp.end.ros_message(0, data, 0, len(data))
    rig.run(50)
    q = rig.gw.clients[ci].queue
    assert q.pending() > 0 and rig.loop.mask[ci] & F.POLLOUT  # waits for POLLOUT
    data = b""
    for _ in range(20):
        data += c.take()  # frames arrive cut at the 256-byte window
        rig.step()
    got = parse_frames(data)
    assert len(got) == 10 and q.pending() == 0
    assert got[9][0] == U.OP_MESSAGE and len(got[9][1]) == 104
    assert not rig.loop.mask[ci] & F.POLLOUT


def test_a_burst_of_frames_is_handled_over_turns_and_others_are_served_meanwhile():
    rig = Rig()
    rig.up()
    a = rig.connect()
    b = rig.connect()
    a.send(hello())
    b.send(hello())
    rig.run(30)
    frames(a)
    frames(b)
    ping = U.encode_frame(U.OP_PING, b"")
    a.send(ping * (U.FRAMES_PER_TURN * 3))  # three turns' worth of frames in one read
    rig.step()
    b.send(ping)
    rig.step()
    assert [op for op, _ in frames(b)] == [U.OP_PONG]  # served in the next turn
    got = frames(a)
    assert 0 < len(got) < U.FRAMES_PER_TURN * 3  # a's frames take turns of their own
    rig.run(50)
    assert len(got) + len(frames(a)) == U.FRAMES_PER_TURN * 3  # and every one is answered
    assert not rig.gw.backlog(ci_of(rig, a))


def test_uart_link_is_paced_to_the_line_rate():
    rig = Rig(link="uart:1", baud=9600, tx=17, rx=16)
    u = rig.machine.uarts[1]
    assert u.kw["baudrate"] == 9600 and u.kw["timeout"] == 0
    assert u.kw["tx"] == 17 and u.kw["rx"] == 16
    rig.up()
    c = rig.connect()
    c.send(hello() + advertise(1, "/cmd", "std_msgs/msg/String", QOS_R))
    rig.run(100)
    frames(c)
    start = u.written
    for _ in range(20):
        c.send(publish(1, bytes(200)))
        rig.step(10)
    rig.run(800)  # 1 s in all
    sent = u.written - start
    # 9600 baud = 960 bytes/s; 60 ms of banked credit and one frame may go beyond it
    assert 700 < sent <= 960 + 58 + 1088, sent
    rig.run(6000)  # 20 x 215 bytes of frames take ~4.5 s of line time
    assert rig.comp.ros.published == 20, rig.drv.counters()
    assert rig.drv.counters()["drop_rel_full"] == 0


def test_a_reliable_burst_waits_in_the_client_socket_not_in_the_gateway():
    # issue 12: the line (9600 baud) cannot take the burst; the gateway stops reading the
    # client (poll mask 0) instead of dropping or queueing, and delivers all once it drains
    rig = Rig(link="uart:1", baud=9600)
    rig.up()
    c = rig.connect(cap=65536)
    c.send(hello() + advertise(1, "/cmd", "std_msgs/msg/String", QOS_R))
    rig.run(100)
    frames(c)
    for i in range(30):
        c.send(publish(1, bytes([i]) * 500))
    rig.run(300)
    ci = ci_of(rig, c)
    assert rig.gw.clients[ci].blocked and rig.loop.mask[ci] == 0
    assert rig.comp.ros.published < 30
    for _ in range(5):  # 30 x ~510 bytes of frames take ~16 s at 960 bytes/s
        rig.run(5000)
        c.send(U.encode_frame(U.OP_PING, b""))  # a live client (idle ones close after 10 s)
    assert rig.comp.ros.published == 30, rig.drv.counters()
    assert not rig.gw.clients[ci].blocked and rig.loop.mask[ci] != 0
    k = rig.ros.counters()
    assert k["drop_rel_full"] == 0 and k["pub_congested"] == 0
    assert set(op for op, _ in frames(c)) == {U.OP_PONG}   # no ERROR


def test_udp_send_errors_are_lost_datagrams():
    rig = Rig()
    rig.up()
    c = rig.connect()
    c.send(hello() + advertise(1, "/chatter", "std_msgs/msg/String", QOS_R))
    rig.run(50)
    rig.drv.t.sock.fail_writes = 3  # ENOMEM from lwIP
    for i in range(3):
        c.send(publish(1, bytes([i]) * 10))
        rig.step()
    rig.run(2000)
    assert rig.drv.counters()["io_err"] == 3
    assert rig.comp.ros.published == 3  # retransmitted by the link
    assert rig.drv.counters()["retx"] >= 1


def test_foreign_datagrams_are_ignored():
    rig = Rig()
    rig.up()
    other = F.UdpPeer(rig.net, ("10.0.0.66", 9999))
    other.send(rig.comp.s.tx_buf, 0, 40, rig.drv.t.sock.local)
    rig.step()
    assert rig.drv.t.sock.foreign == 1  # dropped by the connected socket, as by the stack
    assert rig.drv.s.counters()["noise"] == 0


def test_wifi_bring_up():
    rig = Rig(wifi_ssid="lab", wifi_password="pw")
    w = rig.network.wlan
    assert w.joined == ("lab", "pw") and w.on
    assert w.cfg.get("pm") == 0  # power saving off
    assert rig.time.slept >= 300
    text = "\n".join(m for lv, m in rig.logged)
    assert "Wi-Fi: connected, address 10.0.0.1" in text
    net = F.FakeNetwork(F.FakeTime())
    io = ML.IO(None, None, net.time, None, net, None)
    net.WLAN(0).after = 10 ** 6
    try:
        G.wifi_up(io, "lab", "pw", 2, ML.Log("error"))
    except OSError:
        pass
    else:
        raise AssertionError("no error")


def test_shutdown_closes_everything():
    rig = Rig()
    rig.up()
    c = rig.connect()
    c.send(hello())
    rig.run(20)

    def interrupt():
        raise KeyboardInterrupt

    rig.loop.serve(interrupt)  # Ctrl-C on a board
    assert c.peer_closed and rig.loop.lsock.closed and rig.drv.t.sock.closed
    assert rig.gw.active_clients() == 0 and not rig.loop.running


# ---------------------------------------------------------------------------------------------
# allocation (MicroPython: gc.mem_alloc() with the collector off)
# ---------------------------------------------------------------------------------------------
N = 2000


def relay_rig():
    """The port's loop with an in-process ROS side (no link): only the port's I/O and the core."""
    net = F.Net()
    t = F.FakeTime()
    io = ML.IO(net.socket, F.select_module(), t, None, None, None)
    ros = ScriptedRos()
    ros.record = False
    gw = U.Gateway(scripted_profile(), ros=ros)
    ros.up()
    loop = ML.GatewayLoop(gw, ("0.0.0.0", PORT), io, log=ML.Log("error"))
    loop.poll_ms = 0
    loop.step()
    pubc = net.connect(PORT, 65536)
    subc = net.connect(PORT, 65536)
    loop.step()
    pubc.send(hello() + advertise(1, "/scan", "sensor_msgs/msg/LaserScan", QOS_BE))
    subc.send(hello() + subscribe(4, "/odom", "nav_msgs/msg/Odometry"))
    loop.step()
    pubc.take()
    subc.take()
    return loop, gw, ros, t, pubc, subc


def scripted_profile():
    p = dict(ubrb_setup.PROFILES["mcu"])
    p["queue_bytes"] = 16384
    return ubrb_setup.make_profile("mcu", p)


def test_client_relay_through_the_port_allocates_nothing():
    loop, gw, ros, t, pubc, subc = relay_rig()
    frame = publish(1, bytes(range(200)))
    half = len(frame) // 2
    msg = bytearray(300)
    slot = gw.subs.find("/odom")
    nf = len(frame)

    def relay(rounds, split):
        for _ in range(rounds):
            # a PUBLISH arrives on one socket and goes to the ROS side; a ROS message goes out
            # as MESSAGE on the other socket; each client drains what it got
            if split:
                pubc.write(frame, 0, half)
                t.advance(1)
                loop.step()
                pubc.write(frame, half, nf - half)
            else:
                pubc.write(frame, 0, nf)
            gw.ros_message(slot, msg, 0, 300)
            t.advance(1)
            loop.step()
            subc.drop()

    relay(50, False)
    relay(50, True)  # warm-up
    gc.collect()
    gc.disable()
    try:
        before = gc.mem_alloc()
        relay(N, False)
        whole = gc.mem_alloc() - before
        before = gc.mem_alloc()
        relay(N, True)
        split = gc.mem_alloc() - before
    finally:
        gc.enable()
    assert ros.published == 2 * N + 100
    assert gw.counters()["message_out"] == 2 * N + 100
    print("port relay: %d bytes over %d whole-frame relays; %d bytes over %d split ones "
          "(%.1f per continued read)" % (whole, N, split, N, split / N))
    assert whole == 0, whole
    # one memoryview slice (a 16-byte block on 32-bit ports) per read continuing a partial frame
    assert split <= 16 * N, split


def test_link_relay_allocation_per_message():
    rig = Rig(stats_ms=0)  # the 1 s STATS record is measured on its own below
    rig.up()
    rig.comp.ros.record = False
    c = rig.connect(65536)
    c.send(hello() + advertise(1, "/chatter", "std_msgs/msg/String", QOS_R)
           + subscribe(4, "/odom", "nav_msgs/msg/Odometry", QOS_R))
    rig.run(100)
    c.take()
    frame = publish(1, bytes(64))
    msg = bytearray(64)
    nf = len(frame)
    loop = rig.loop
    comp = rig.comp

    def relay(rounds):
        # gateway side only: gc.mem_alloc() deltas around the gateway's step (the companion's
        # pump, a PC in real life, is outside the sums)
        gw_bytes = 0
        for _ in range(rounds):
            c.write(frame, 0, nf)
            comp.end.ros_message(0, msg, 0, 64)
            comp.pump(rig.now())
            rig.time.advance(2)
            a = gc.mem_alloc()
            loop.step()
            gw_bytes += gc.mem_alloc() - a
            comp.pump(rig.now())
            c.drop()
        return gw_bytes

    relay(50)
    published = comp.ros.published
    tx0 = rig.drv.s.counters()["tx_frames"]
    gc.collect()
    gc.disable()
    try:
        gw_bytes = relay(N)
    finally:
        gc.enable()
    assert comp.ros.published - published == N
    assert rig.gw.counters()["message_out"] >= N
    tx = rig.drv.s.counters()["tx_frames"] - tx0
    per = gw_bytes / N
    print("link relay, gateway side: %d bytes over %d PUBLISH + %d MESSAGE, %d frames sent "
          "(%.1f per pair, %.1f per frame sent)" % (gw_bytes, N, N, tx, per, gw_bytes / tx))
    # A sent frame's CRC-32 is taken over tx_buf itself, no view of it (LinkSession._seal): on
    # a 64-bit port nothing at all is allocated; on a 32-bit one (this WebAssembly build, an
    # ESP32) the CRC value is a big int (32 B) when >= 2**30, 3 times in 4 (docs/LINK.md,
    # section 8): ~24 B per frame, and before the view went 40. The port adds nothing; a real
    # recv() adds the datagram's bytes object (tests/link/test_link_alloc.py, real sockets).
    big = 0 if sys.maxsize > (1 << 31) else 32
    assert gw_bytes <= big * tx, gw_bytes
    rig.loop.ros = rig.ros
    rig.loop._send_stats()  # the first record: every counter (the companion had none)
    relay(20)               # a little traffic: the next record has what changed since
    rig.run(200)            # (stats go when the link has nothing else queued)
    gc.collect()
    gc.disable()
    try:
        a = gc.mem_alloc()
        rig.gw.counters()
        rig.drv.counters()
        given = gc.mem_alloc() - a  # the dicts of counters (the Gateway's, the link driver's)
        q = rig.ros.s.beq.n
        a = gc.mem_alloc()
        rig.loop._send_stats()
        stats = gc.mem_alloc() - a
        rec = rig.ros.s.beq.n - q  # the record as queued, with its 6-byte tag and header
    finally:
        gc.enable()
    print("one STATS record (every stats_ms, default 1 s): %d bytes, %d of them the counters' "
          "dicts; a record of %d bytes queued" % (stats, given, rec))
    # The port hands the link's counters over as they are: no merged dict with a link_<name>
    # string and an entry for each of them (beyond the dicts: 2,320 bytes before, 960 now on
    # this 32-bit build); what is left: the lists of the dicts' names, the record's text and
    # the names of what changed.
    word = 4 if sys.maxsize < (1 << 32) else 8
    assert 0 < rec < 500 and stats - given <= 256 * word + 2 * rec, (stats, given, rec)


def test_allow_lists_and_throttle_flags_on_the_micropython_port():
    # issue 13: the policy flags are the CPython port's, parsed by the core on the board too
    o = G.parse_args(["--allow-topics", "/ue/*", "--deny-topics", "/ue/x", "--throttle",
                      "/ue/imu=50", "--allow-clients", "127.0.0.0/8"])
    assert o["allow_topics"] == "/ue/*" and o["throttle"] == "/ue/imu=50"
    assert "--allow-clients" in G.usage() and "--throttle" in G.usage()
    rig = Rig(allow_topics="/ue/*", throttle="/ue/imu=50")
    rig.up()
    assert rig.gw.throttle is not None and rig.gw.policy.throttle == [("/ue/imu", 20)]
    c = rig.connect()
    c.send(hello() + subscribe(1, "/odom", "nav_msgs/msg/Odometry", QOS_R))
    rig.run(50)
    errs = [json.loads(p) for op, p in frames(c) if op == U.OP_ERROR]
    assert [(e["code"], e["id"]) for e in errs] == [("topic_denied", 1)]
    io = ML.IO(None, None, None, None, None, None)
    assert G.main(["--allow-clients", "10.0.0.300"], io) == 2  # one line, exit 2


def test_the_board_serves_with_only_the_modules_it_runs():
    # run.main, as main.py calls it: the start-up modules (gateway.py, ubrb_setup, build.py) are
    # gone from sys.modules when the loop starts serving (their code freed); ubrb_policy is
    # loaded only with a policy flag, ubrb_keyed only with a link key. Each run serves a HELLO,
    # so a module the running gateway still needs would fail here, not on a board.
    import sys

    from ports.micropython import run

    def serve_once(flags, key=None):
        net = F.Net()
        t = F.FakeTime(0)
        io = ML.IO(net.socket, F.select_module(), t, F.FakeMachine(), F.FakeNetwork(t), None)
        comp = F.UdpCompanion(net, COMPANION, key=key)
        seen = []

        def serve(loop):
            seen.append(sorted([m for m in sys.modules if m.startswith("ubrb") or
                                m.startswith("ports.micropython.")]))
            loop.poll_ms = 0
            c = None
            for _ in range(400):
                t.advance(10)
                loop.step()
                comp.pump(loop.clock.now)
                if c is None:
                    c = net.connect(PORT, 8192)
                    c.send(hello())
            assert c is not None and [op for op, _ in frames(c)][:1] == [U.OP_HELLO_ACK]
            return 0

        real = ML.GatewayLoop.run
        ML.GatewayLoop.run = serve
        try:
            assert run.main(["--listen", "0.0.0.0:%d" % PORT, "--link", "udp://10.0.0.2:8269",
                             "--insecure-link", "--log-level", "error"] + flags, io) == 0
        finally:
            ML.GatewayLoop.run = real
        for m in ("ports.micropython.gateway", "ports.micropython.build", "ubrb_setup"):
            sys.modules.pop(m, None)  # the next run (or test) imports them afresh
        return seen[0]

    start_up = ["ports.micropython.build", "ports.micropython.gateway", "ubrb_setup"]
    for m in ("ubrb_policy", "ubrb_keyed"):
        sys.modules.pop(m, None)
    plain = serve_once([])
    assert [m for m in start_up + ["ubrb_policy", "ubrb_keyed"] if m in plain] == [], plain
    assert "ubrb_min" in plain and "ports.micropython.loop" in plain
    with_policy = serve_once(["--allow-topics", "/a/*"])
    assert "ubrb_policy" in with_policy and "ubrb_keyed" not in with_policy
    assert [m for m in start_up if m in with_policy] == []
    with KeyFile() as path:
        keyed = serve_once(["--link-key", path], key=ubrb_setup.parse_link_key(KEY_HEX))
    assert "ubrb_keyed" in keyed and [m for m in start_up if m in keyed] == []

# Allow-lists and throttle in the core (issue 13 items 3-4): the glob and CIDR matchers, ERROR
# topic_denied, peers refused at accept, and the newest-wins throttle with its period-end delivery.
# Runs under CPython and real MicroPython (no fnmatch, no ipaddress there).
import gc

import ubrb_min as U
import ubrb_policy
import ubrb_setup
from scripted import Client, ScriptedRos, profile
from tests.support.ubrb_frames import advertise, hello, subscribe

CPYTHON_ONLY = {"test_gateway_counter_indices_follow_the_names"}  # _GS_* inlined on MicroPython


def policy_gateway(**opts):
    ros = ScriptedRos()
    gw = U.Gateway(profile(), ros=ros)
    policy = ubrb_setup.policy_from_options(opts)
    if policy is not None:
        ubrb_setup.apply_policy(gw, policy)
    ros.up()
    return gw, ros


def ready(gw, now=0):
    c = Client(gw, now)
    c.send(hello(), now)
    c.frames()
    return c


def test_glob_matches_whole_topic_names():
    m = ubrb_policy.glob_match
    assert m("/imu/*", "/imu/data") and m("/imu/*", "/imu/a/b")  # '*' crosses '/'
    assert not m("/imu/*", "/imu") and not m("/imu/*", "/imux/data")
    assert m("/cam?/image", "/cam1/image") and not m("/cam?/image", "/cam12/image")
    assert m("*", "/anything") and m("/a*b*c", "/axxbyyc") and not m("/a*b*c", "/axxbyy")
    assert m("/exact", "/exact") and not m("/exact", "/exact2") and not m("/exact2", "/exact")
    assert m("**", "") and not m("?", "")


def test_cidr_lists_match_ipv4_ipv6_and_mapped_peers():
    nets = ubrb_setup.parse_cidrs("127.0.0.2/32, 10.0.0.0/8,192.168.1.128/25 ,fd00::/8,::1")
    peer = ubrb_policy.peer_address
    assert ubrb_policy.cidr_match(nets, peer(("127.0.0.2", 4000)))
    assert not ubrb_policy.cidr_match(nets, peer(("127.0.0.1", 4000)))
    assert ubrb_policy.cidr_match(nets, peer(("10.200.3.4", 1)))
    assert ubrb_policy.cidr_match(nets, peer(("192.168.1.200", 1)))
    assert not ubrb_policy.cidr_match(nets, peer(("192.168.1.127", 1)))
    assert ubrb_policy.cidr_match(nets, peer(("fd12:3456::1", 1, 0, 0)))
    assert ubrb_policy.cidr_match(nets, peer(("::1", 1, 0, 0)))
    assert not ubrb_policy.cidr_match(nets, peer(("fe80::1%lo", 1, 0, 0)))
    assert ubrb_policy.cidr_match(nets, peer(("::ffff:10.1.2.3", 1, 0, 0)))  # dual-stack socket, v4 peer
    assert ubrb_policy.cidr_match(ubrb_setup.parse_cidrs("0.0.0.0/0"), peer(("8.8.8.8", 1)))
    assert not ubrb_policy.cidr_match(nets, None)


def test_raw_sockaddr_peers_of_the_micropython_unix_port():
    # family (host order), port (network order), address: what its accept() returns
    v4 = bytes([2, 0, 0x1F, 0x90, 127, 0, 0, 2]) + bytes(8)
    assert ubrb_policy.peer_address(v4) == bytes([127, 0, 0, 2])
    v6 = bytes([10, 0, 0x1F, 0x90, 0, 0, 0, 0]) + bytes(15) + b"\x01" + bytes(4)
    assert ubrb_policy.peer_address(v6) == bytes(15) + b"\x01"
    assert ubrb_policy.cidr_match(ubrb_setup.parse_cidrs("::1"), ubrb_policy.peer_address(v6))


def test_bad_lists_say_which_entry_is_wrong():
    for text in ("127.0.0.300", "10.0.0.0/33", "::1/129", "1:2:3", "host.example", ""):
        try:
            ubrb_setup.parse_cidrs(text)
        except ValueError as e:
            assert str(e)
        else:
            raise AssertionError(text)
    for text in ("/imu", "/imu=0", "/imu=abc", "=5", "/imu=5000"):
        try:
            ubrb_setup.parse_throttle([text])
        except ValueError as e:
            assert "GLOB=HZ" in str(e)
        else:
            raise AssertionError(text)
    assert ubrb_setup.parse_throttle(["/imu/*=50,/scan=3", "/odom=1000"]) == [
        ("/imu/*", 20), ("/scan", 333), ("/odom", 1)]


def test_denied_topics_get_topic_denied_and_register_nothing():
    gw, ros = policy_gateway(allow_topics="/cmd_vel,/ue/*", deny_topics="/ue/secret*")
    c = ready(gw)
    c.send(advertise(1, "/cmd_vel") + advertise(2, "/odom") + subscribe(3, "/ue/pose")
           + subscribe(4, "/ue/secret/key") + subscribe(5, "/tf"))
    errs = c.json_frames(U.OP_ERROR)
    assert [(e["code"], e["id"]) for e in errs] == [
        ("topic_denied", 2), ("topic_denied", 4), ("topic_denied", 5)]
    assert "--allow-topics" in errs[0]["message"] and "/odom" in errs[0]["message"]
    assert "--deny-topics /ue/secret*" in errs[1]["message"]
    assert [(n, t) for n, s, t, ty, r in ros.take()] == [
        ("advertise", "/cmd_vel"), ("subscribe", "/ue/pose")]
    assert gw.counters()["topics_denied"] == 3
    # nothing held for the refused ids: they are free to use for allowed topics
    c.send(advertise(2, "/ue/cmd"))


def test_relative_names_cannot_slip_past_a_deny_list():
    # The companion resolves relative and private names under its namespace (issue 21): with
    # --deny-topics /secret*, `secret` (-> /secret) and `~/secret` must not get through.
    gw, ros = policy_gateway(deny_topics="/secret*")
    c = ready(gw)
    c.send(advertise(1, "secret") + subscribe(2, "~/secret") + advertise(3, "odom")
           + advertise(4, "/odom"))
    errs = c.json_frames(U.OP_ERROR)
    assert [(e["code"], e["id"]) for e in errs] == [
        ("topic_denied", 1), ("topic_denied", 2), ("topic_denied", 3)]
    assert "secret is not absolute: with --allow-topics/--deny-topics give the full name" \
        in errs[0]["message"]
    assert [(n, t) for n, s, t, ty, r in ros.take()] == [("advertise", "/odom")]
    assert c.errors() == []


def test_peers_outside_allow_clients_are_refused_at_accept_and_counted():
    gw, ros = policy_gateway(allow_clients="127.0.0.2/32,::1")
    assert gw.accept(0, ("127.0.0.1", 5000)) == -1
    assert gw.reject_frame() == b""  # closed without a word: nothing to learn about the gateway
    ci = gw.accept(0, ("127.0.0.2", 5001))
    assert ci >= 0
    assert gw.accept(0, ("::1", 5002, 0, 0)) >= 0
    assert gw.counters()["clients_refused_address"] == 1
    assert gw.counters()["clients_rejected"] == 0
    # capacity refusals still get their ERROR
    assert gw.accept(0, ("127.0.0.2", 5003)) >= 0
    assert gw.accept(0, ("127.0.0.2", 5004)) == -1
    assert b"too_many_clients" in gw.reject_frame()


def message_ids(frames):
    return [U.get_u32(p, 0) for op, p in frames if op == U.OP_MESSAGE]


def stream(gw, slot, c, start, ms, every=1):
    """A ROS message on `slot` every `every` ms from `start` for `ms` ms (payload: its time as a
    u32), the gateway ticked each ms; returns the payload times the client got, in order."""
    msg = bytearray(64)
    got = []
    for t in range(start, start + ms):
        gw.tick(t)
        if (t - start) % every == 0:
            U.put_u32(msg, 0, t)
            gw.now = t
            gw.ros_message(slot, msg, 0, 64)
        for op, p in c.frames():
            if op == U.OP_MESSAGE:
                got.append(U.get_u32(p, 4))
    return got


def test_throttle_one_message_per_period_newest_wins_last_one_delivered():
    gw, ros = policy_gateway(throttle=["/imu*=50"])
    c = ready(gw)
    c.send(subscribe(7, "/imu/data") + subscribe(8, "/odom"))
    imu = gw.subs.find("/imu/data")
    odom = gw.subs.find("/odom")
    got = stream(gw, imu, c, 1000, 1000)  # 1 kHz for one second
    assert len(got) == 50, got  # exactly 50 Hz
    assert got[0] == 1000  # the first of a quiet topic goes out at once
    assert got == sorted(got) and len(set(got)) == 50
    # each later one is the newest of its period, sent when the period ends (t = 1020, 1040...)
    assert got[1:] == list(range(1019, 1980, 20)), got
    # the burst's last message (t=1999) was held, and goes out when its period ends at 2000;
    # one more message at t=2000 opens a period of its own and follows at 2020
    tail = stream(gw, imu, c, 2000, 40, every=1000)
    assert tail == [1999, 2000], tail
    assert gw.counters()["throttle_superseded"] == gw.throttle.superseded >= 900
    # an unthrottled topic on the same gateway gets everything
    assert len(stream(gw, odom, c, 3000, 100)) == 100


def test_a_slow_topic_under_its_rate_is_not_delayed():
    gw, ros = policy_gateway(throttle=["/imu=50"])
    c = ready(gw)
    c.send(subscribe(1, "/imu"))
    got = stream(gw, gw.subs.find("/imu"), c, 0, 1000, every=25)  # 40 Hz < 50 Hz
    assert got == list(range(0, 1000, 25))


def test_throttled_slots_share_the_holding_buffers_and_give_them_back():
    gw, ros = policy_gateway(throttle=["*=10"])  # the test profile has max_throttled = 1
    logs = []
    gw.log = lambda level, m: logs.append(m)
    c = ready(gw)
    c.send(subscribe(1, "/a") + subscribe(2, "/b"))
    assert any("/b not throttled" in m and "--max-throttled" in m for m in logs), logs
    b = gw.subs.find("/b")
    assert len(stream(gw, b, c, 0, 50)) == 50  # unthrottled, never dropped
    c.send(U.encode_json_frame(U.OP_UNSUBSCRIBE, {"id": 1}))  # /a's slot is freed ...
    c.send(subscribe(3, "/c"))  # ... so /c gets its buffer
    got = stream(gw, gw.subs.find("/c"), c, 100, 300)
    assert len(got) == 3, got


def test_throttle_deadline_wakes_the_port_when_a_message_is_held():
    gw, ros = policy_gateway(throttle=["/imu=50"])
    c = ready(gw)
    c.send(subscribe(1, "/imu"))
    slot = gw.subs.find("/imu")
    assert stream(gw, slot, c, 0, 5) == [0]  # 0 sent, 1..4 held (4 newest)
    assert gw.next_deadline(5) == 15  # the period ends at 20
    gw.rebase(5)  # a MicroPython clock rebase moves the period end too
    assert gw.next_deadline(0) == 15


def test_the_throttle_path_allocates_nothing():
    gw, ros = policy_gateway(throttle=["/imu=50"])
    ros.record = False
    c = ready(gw)
    c.send(subscribe(1, "/imu"))
    slot = gw.subs.find("/imu")
    q = c.session.queue
    msg = bytearray(200)

    def run(start, n):
        for t in range(start, start + n):
            gw.tick(t)
            gw.now = t
            gw.ros_message(slot, msg, 0, 200)
            while q.peek():
                q.sent(q.peek())

    run(0, 100)  # warm-up
    if U.IS_MICROPYTHON:
        gc.collect()
        gc.disable()
        before = gc.mem_alloc()
        run(100, 5000)
        grew = gc.mem_alloc() - before
        gc.enable()
        assert grew == 0, grew
    else:
        import tracemalloc
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        run(100, 5000)
        grew = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert grew <= 1024, grew
    assert gw.counters()["message_out"] == 5100 // 20  # t = 0, 20 (19), ..., 5080 (5079)


def test_memory_budget_counts_the_holding_buffers():
    p = ubrb_setup.make_profile("pi")
    b = ubrb_setup.memory_budget(p)
    assert b["throttle"] == p["max_throttled"] * p["max_payload"] == 8 * 4 * ubrb_setup.MIB
    assert b["total"] == b["clients"] + b["slots"] + b["throttle"]
    assert "throttle holding buffers: 8 x 4.0 MiB" in ubrb_setup.format_budget("pi", p)


GATEWAY_COUNTERS = [
    "clients_accepted", "clients_rejected", "frames_in", "frames_out", "publish_in", "message_out",
    "dropped_no_ros", "dropped_queue", "evicted", "errors_sent", "rejected_per_address",
    "closed_slow", "closed_frame_timeout", "clients", "pub_topics", "sub_topics", "queue_refused",
    "queued_bytes", "ros_ready"]


def test_gateway_counters_keep_their_names_and_add_the_policy_ones_with_a_policy():
    # The Gateway's counters live in one list (Gateway.stat_counts, by the _GS_* indices of
    # _GW_STATS); counters() reports them by the names users read.
    gw = U.Gateway(profile(), ros=ScriptedRos())
    assert sorted(gw.counters()) == sorted(GATEWAY_COUNTERS)
    pgw, _ = policy_gateway(deny_topics="/secret")
    assert sorted(pgw.counters()) == sorted(GATEWAY_COUNTERS + [
        "clients_refused_address", "topics_denied"])


def test_gateway_counter_indices_follow_the_names():
    names = U._GW_STATS.split()
    assert [getattr(U, "_GS_" + k.upper()) for k in names] == list(range(len(names)))
    assert U._GS_N == len(names) and U._GS_N_PLAIN == names.index("clients_refused_address")
    assert list(U.Gateway(profile(), ros=ScriptedRos()).counters()) == GATEWAY_COUNTERS  # order

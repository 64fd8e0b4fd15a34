"""Both backends against real ROS 2 peers, every process on loopback (see ros_procs.py).

Pairs (companion backend, peer):
  dds   / rclpy    the dds backend (cyclonedds) vs a real rclpy node (Kilted, rmw_fastrtps_cpp)
  dds   / cyclone  the dds backend vs a plain cyclonedds participant in another process
  rclpy / rclpy    the rclpy backend run by the real Kilted rclpy vs a real rclpy node
  rclpy / cyclone  the rclpy backend (Fast DDS) vs a plain cyclonedds participant

The companion runs in its own process (``companion_host.py``) under the interpreter of its backend,
so the rclpy backend runs on the real Kilted rclpy, not on a stand-in. Message contents are
built from the Kilted definitions (rosbags) with every field set, sequences of odd length, and
compared after decoding (Fast DDS pads samples to a multiple of 4, see ROS-NOTES.md).
"""

import os
import subprocess
import sys
import time
from unittest.mock import ANY

import numpy as np
import pytest
from rosbags.interfaces import Nodetype
from rosbags.typesys import Stores, get_typestore

from ros_helpers import TEST_DOMAIN, wait_for
from tests.support.ros_procs import ROS_PYTHON, Host, Peer, require_ros, ros_env, udp_sockets

STORE = get_typestore(Stores.ROS2_KILTED)

# Every type the demo, the client CLI and the simulated robot use, and every type the issue
# found failing against Fast DDS (a sequence or an array somewhere inside).
TYPES = [
    "std_msgs/msg/String", "std_msgs/msg/Header", "std_msgs/msg/UInt8MultiArray",
    "std_msgs/msg/Float64MultiArray", "geometry_msgs/msg/Twist", "geometry_msgs/msg/PoseStamped",
    "geometry_msgs/msg/TransformStamped", "geometry_msgs/msg/PoseArray", "rosgraph_msgs/msg/Clock",
    "sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage", "sensor_msgs/msg/LaserScan",
    "sensor_msgs/msg/Imu", "sensor_msgs/msg/JointState", "sensor_msgs/msg/PointCloud2",
    "sensor_msgs/msg/CameraInfo", "nav_msgs/msg/Odometry", "nav_msgs/msg/Path",
    "diagnostic_msgs/msg/DiagnosticArray",
]
PAIRS = [("dds", "rclpy"), ("dds", "cyclone"), ("rclpy", "rclpy"), ("rclpy", "cyclone")]
RELIABILITY = ["reliable", "best_effort"]


def qos(reliability="reliable", durability="volatile", depth=10):
    return {"reliability": reliability, "durability": durability, "depth": depth}


# -- message contents ---------------------------------------------------------------------------
_NP = {"bool": np.bool_, "byte": np.uint8, "char": np.uint8, "int8": np.int8, "uint8": np.uint8,
       "int16": np.int16, "uint16": np.uint16, "int32": np.int32, "uint32": np.uint32,
       "int64": np.int64, "uint64": np.uint64, "float32": np.float32, "float64": np.float64}


def _base(t, bound, name, seed):
    if t == "string":
        s = "%s-%d" % (name, seed)
        return s[:bound] if bound else s
    if t == "bool":
        return bool(seed % 2)
    if t.startswith("float"):
        return 0.25 + seed
    return (seed + 3) % 100


def _value(desc, name, seed):
    kind, arg = desc
    if kind == Nodetype.BASE:
        return _base(arg[0], arg[1], name, seed)
    if kind == Nodetype.NAME:
        return make(arg, seed)
    sub, n = arg
    if kind == Nodetype.SEQUENCE:
        n = min(n, 3) if n else 3          # odd lengths: no accidental 4-alignment
    if sub[0] == Nodetype.BASE and sub[1][0] in _NP:
        return np.array([_base(sub[1][0], 0, name, seed + i) for i in range(n)],
                        dtype=_NP[sub[1][0]])
    return [_value(sub, name, seed + i) for i in range(n)]


def make(ros_type, seed=1):
    """A message of ``ros_type`` with every field set (from the Kilted definitions)."""
    fields = STORE.fielddefs[ros_type][1]
    return STORE.types[ros_type](**{f: _value(d, f, seed) for f, d in fields})


def ser(msg, ros_type):
    return bytes(STORE.serialize_cdr(msg, ros_type))


def canonical(raw, ros_type):
    """The CDR re-serialised after decoding: equal for the same message whatever the padding."""
    return ser(STORE.deserialize_cdr(raw, ros_type), ros_type)


def image(n):
    T = STORE.types
    return T["sensor_msgs/msg/Image"](
        header=make("std_msgs/msg/Header"), height=1, width=n, encoding="mono8",
        is_bigendian=0, step=n, data=(np.arange(n) % 251).astype(np.uint8))


# -- fixtures -----------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=PAIRS, ids=["%s-vs-%s" % p for p in PAIRS])
def pair(request):
    require_ros()
    backend, peer_kind = request.param
    env = ros_env(ROS_DISTRO="kilted")
    peer = Peer(peer_kind, env)
    host = Host(backend, env)
    try:
        yield host, peer
    finally:
        host.close()
        peer.close()


_serial = [0]


def fresh(prefix):
    """A topic name no other test of this run uses (peers live for the whole module)."""
    _serial[0] += 1
    return "/%s_%d" % (prefix, _serial[0])


def slot():
    _serial[0] += 1
    return _serial[0]


def settle_counts(host, slots, want=1, timeout=10.0):
    """Wait until every publisher slot reported ``want`` subscribers."""
    assert wait_for(lambda: all(host.counts(s)[-1:] == [want] for s in slots), timeout), \
        {s: host.counts(s) for s in slots}


def both_matched(host, peer, pub_slots=(), peer_subs=(), sub_slots=(), peer_pubs=()):
    """Wait until both ends of each link matched: a writer may count a reader that has not yet
    discovered it, and a volatile reader drops what comes before (DDS discovery is not symmetric
    in time), so a test that publishes exactly once waits for both sides."""
    settle_counts(host, pub_slots)
    for k in list(peer_subs) + list(peer_pubs):
        assert wait_for(lambda k=k: peer.call("count", id=k)["count"] == 1, 10), k
    for s in sub_slots:
        assert wait_for(lambda s=s: host.call("matched", slot=s)["count"] == 1, 10), s


# -- data both ways, every type, both reliability classes ---------------------------------------
@pytest.mark.parametrize("rel", RELIABILITY)
def test_every_type_client_to_ros(pair, rel):
    host, peer = pair
    q = qos(rel)
    ends = {}
    for t in TYPES:
        topic, s = fresh("c2r"), slot()
        k = peer.endpoint("sub", topic, t, q)
        assert host.advertise(s, topic, t, q)["code"] is None
        ends[t] = (s, k, ser(make(t), t))
    both_matched(host, peer, pub_slots=[s for s, _, _ in ends.values()],
                 peer_subs=[k for _, k, _ in ends.values()])
    pending = set(TYPES)
    for _ in range(1 if rel == "reliable" else 10):   # best effort: resend what was lost
        for t in pending:
            s, _, data = ends[t]
            host.publish(s, data, reliable=(rel == "reliable"))
        wait_for(lambda p=pending: all(peer.received(ends[t][1]) for t in p), timeout=5)
        pending = {t for t in pending if not peer.received(ends[t][1])}
        if not pending:
            break
    assert not pending, "not delivered to the %s peer: %s" % (peer.kind, sorted(pending))
    for t, (_, k, data) in ends.items():
        got = peer.of("msg", id=k)
        if rel == "reliable":
            assert len(got) == 1, t
        assert got[0]["decoded"], "%s: the peer could not decode it" % t
        assert canonical(bytes.fromhex(got[0]["data"]), t) == data, t


@pytest.mark.parametrize("rel", RELIABILITY)
def test_every_type_ros_to_client(pair, rel):
    host, peer = pair
    q = qos(rel)
    ends = {}
    for t in TYPES:
        topic, s = fresh("r2c"), slot()
        k = peer.endpoint("pub", topic, t, q)
        assert host.subscribe(s, topic, t, q)["code"] is None
        ends[t] = (s, k, ser(make(t, seed=2), t))
    both_matched(host, peer, sub_slots=[s for s, _, _ in ends.values()],
                 peer_pubs=[k for _, k, _ in ends.values()])
    pending = set(TYPES)
    for _ in range(1 if rel == "reliable" else 10):
        for t in pending:
            _, k, data = ends[t]
            peer.call("write", id=k, data=data.hex())
        wait_for(lambda p=pending: all(host.messages(ends[t][0]) for t in p), timeout=5)
        pending = {t for t in pending if not host.messages(ends[t][0])}
        if not pending:
            break
    assert not pending, "not delivered from the %s peer: %s" % (peer.kind, sorted(pending))
    for t, (s, _, data) in ends.items():
        got = host.messages(s)
        if rel == "reliable":
            assert len(got) == 1, t
        assert canonical(got[0], t) == data, t


def test_one_mib_image_both_ways(pair):
    """A 1 MiB image (fragmented; length not a multiple of 4) each way, sent once, arrives.

    Fast DDS writer -> Cyclone reader (the dds backend vs an rclpy node, ROS -> client; the rclpy
    backend vs a cyclonedds node, client -> ROS): Cyclone drops a fragmented sample that is in
    flight when it accepts the first HEARTBEAT of that writer, and the first HEARTBEAT it accepts
    from a Fast DDS writer is the one between the fragments of the first large sample (see
    docs/COMPANION.md, "first large sample"). So in that direction the writer first publishes a
    small image and waits until every reader acknowledged it: a Cyclone reader acknowledges only
    after it accepted a HEARTBEAT, which is what guarantees the next sample (Fast DDS sends the
    HEARTBEAT after its heartbeat period, ~3 s). Every other direction sends the 1 MiB image
    first."""
    host, peer = pair
    t, q = "sensor_msgs/msg/Image", qos(depth=2)
    big = ser(image(1024 * 1024 + 1), t)
    assert len(big) > 1024 * 1024 and len(big) % 4
    small = ser(image(3), t)
    out_topic, in_topic, s_out, s_in = fresh("big_out"), fresh("big_in"), slot(), slot()
    k_in = peer.endpoint("sub", out_topic, t, q)
    k_out = peer.endpoint("pub", in_topic, t, q)
    assert host.advertise(s_out, out_topic, t, q)["code"] is None
    assert host.subscribe(s_in, in_topic, t, q)["code"] is None
    both_matched(host, peer, [s_out], [k_in], [s_in], [k_out])
    # client -> ROS: the companion writes; ROS -> client: the peer writes
    c2r = (lambda d: host.publish(s_out, d), lambda: peer.received(k_in),
           lambda: host.call("acked", slot=s_out, within=10)["acked"])
    r2c = (lambda d: peer.call("write", id=k_out, data=d.hex()), lambda: host.messages(s_in),
           lambda: peer.call("acked", id=k_out, within=10)["acked"])
    fast_to_cyclone = {("rclpy", "cyclone"): c2r, ("dds", "rclpy"): r2c}.get(
        (host.backend, peer.kind))
    warm_up = 0.0
    if fast_to_cyclone:
        send, received, acked = fast_to_cyclone
        t0 = time.monotonic()
        send(small)
        assert wait_for(lambda: len(received()) == 1, 10), "the small image did not arrive"
        assert acked(), "the Cyclone reader never acknowledged the small image"
        warm_up = time.monotonic() - t0

    def deliver(send, received, what):
        before = len(received())
        t0 = time.monotonic()
        send(big)
        assert wait_for(lambda: len(received()) > before, 10), "%s: sent once, not arrived" % what
        return time.monotonic() - t0
    c2r_s = deliver(c2r[0], c2r[1], "client -> ROS")
    r2c_s = deliver(r2c[0], r2c[1], "ROS -> client")
    to_ros, from_ros = peer.received(k_in)[-1:], host.messages(s_in)[-1:]
    assert peer.of("msg", id=k_in)[-1]["decoded"]
    assert to_ros[0][4:len(big)] == big[4:] and canonical(to_ros[0], t) == canonical(big, t)
    assert canonical(from_ros[0], t) == canonical(big, t)
    assert len(peer.received(k_in)) + len(host.messages(s_in)) == 2 + (1 if fast_to_cyclone else 0)
    print("1 MiB image (%s vs %s), sent once: client -> ROS %.2f s; ROS -> client %.2f s%s"
          % (host.backend, peer.kind, c2r_s, r2c_s, "; Fast DDS -> Cyclone small image "
             "acknowledged after %.2f s" % warm_up if fast_to_cyclone else ""))


def test_odd_cdr_lengths_both_ways(pair):
    """Strings of 0..4 characters: CDR lengths 9..13, every remainder mod 4, both ways."""
    host, peer = pair
    t, q = "std_msgs/msg/String", qos()
    texts = ["", "a", "ab", "abc", "abcd"]
    datas = [ser(STORE.types[t](data=x), t) for x in texts]
    assert sorted({len(d) % 4 for d in datas}) == [0, 1, 2, 3]
    out_topic, in_topic, s_out, s_in = fresh("odd_out"), fresh("odd_in"), slot(), slot()
    k_in = peer.endpoint("sub", out_topic, t, q)
    k_out = peer.endpoint("pub", in_topic, t, q)
    assert host.advertise(s_out, out_topic, t, q)["code"] is None
    assert host.subscribe(s_in, in_topic, t, q)["code"] is None
    both_matched(host, peer, [s_out], [k_in], [s_in], [k_out])
    for d in datas:
        host.publish(s_out, d)
        peer.call("write", id=k_out, data=d.hex())
    assert wait_for(lambda: len(peer.received(k_in)) == 5 and len(host.messages(s_in)) == 5, 10)
    for sent, to_ros, from_ros in zip(datas, peer.received(k_in), host.messages(s_in)):
        # the client's bytes arrive first, then at most 3 padding bytes (0 or Fast DDS's)
        assert to_ros[4:len(sent)] == sent[4:] and len(to_ros) - len(sent) in (0, 1, 2, 3)
        assert from_ros[4:len(sent)] == sent[4:] and len(from_ros) - len(sent) in (0, 1, 2, 3)
        assert STORE.deserialize_cdr(from_ros, t).data == STORE.deserialize_cdr(sent, t).data


# -- durability ---------------------------------------------------------------------------------
def test_transient_local_both_ways(pair):
    """A late joiner gets the last sample, whichever side published it."""
    host, peer = pair
    t, latched = "geometry_msgs/msg/TransformStamped", qos(durability="transient_local", depth=1)
    old, new = ser(make(t, seed=5), t), ser(make(t, seed=6), t)
    # client publishes first, the ROS subscription comes later
    topic_a, s_a = fresh("latch_c2r"), slot()
    assert host.advertise(s_a, topic_a, t, latched)["code"] is None
    host.publish(s_a, old)
    host.publish(s_a, new)
    time.sleep(0.2)
    k = peer.endpoint("sub", topic_a, t, latched)
    assert wait_for(lambda: peer.received(k), 10)
    time.sleep(0.2)
    assert [canonical(r, t) for r in peer.received(k)] == [new]      # depth 1: the last one
    # the ROS publisher publishes first, the client subscribes later
    topic_b, s_b = fresh("latch_r2c"), slot()
    kp = peer.endpoint("pub", topic_b, t, latched)
    peer.call("write", id=kp, data=old.hex())
    peer.call("write", id=kp, data=new.hex())
    time.sleep(0.2)
    assert host.subscribe(s_b, topic_b, t, latched)["code"] is None
    assert wait_for(lambda: host.messages(s_b), 10)
    time.sleep(0.2)
    assert [canonical(r, t) for r in host.messages(s_b)] == [new]


# -- subscriber counts and QoS mismatch -----------------------------------------------------------
def test_counts_follow_the_client_within_a_second(pair):
    """The ROS side sees a client's subscription come and go within 1 s, and the client's
    publisher slot reports ROS subscriptions coming and going."""
    host, peer = pair
    t, q = "std_msgs/msg/String", qos()
    topic, s = fresh("cnt"), slot()
    k = peer.endpoint("pub", topic, t, q)

    def peer_count():
        return peer.call("count", id=k)["count"]
    assert peer_count() == 0
    t0 = time.monotonic()
    assert host.subscribe(s, topic, t, q)["code"] is None
    assert wait_for(lambda: peer_count() == 1, 1.0), "rise not seen within 1 s"
    rise = time.monotonic() - t0
    t0 = time.monotonic()
    host.call("unsubscribe", slot=s)
    assert wait_for(lambda: peer_count() == 0, 1.0), "fall not seen within 1 s"
    fall = time.monotonic() - t0
    # and the other way: the client's publisher counts ROS subscriptions (foreign only)
    topic2, s2 = fresh("cnt_pub"), slot()
    assert host.advertise(s2, topic2, t, q)["code"] is None
    settle_counts(host, [s2], want=0)
    k2 = peer.endpoint("sub", topic2, t, q)
    settle_counts(host, [s2], want=1, timeout=2)
    peer.call("drop", id=k2)
    settle_counts(host, [s2], want=0, timeout=2)
    print("ROS-side count (%s vs %s): rise %.0f ms, fall %.0f ms"
          % (host.backend, peer.kind, rise * 1000, fall * 1000))


def test_qos_mismatch_is_reported_to_the_client(pair):
    """A reliable ROS subscription cannot match a best_effort publisher: the client's slot gets
    ``qos_incompatible`` naming RELIABILITY (and no subscriber is counted). One vocabulary on
    every backend, rclpy's QoSPolicyKind names (before issue 21 the rclpy backend said
    "RMW_QOS_POLICY_RELIABILITY", the dds backend "RELIABILITY")."""
    host, peer = pair
    t = "std_msgs/msg/String"
    topic, s = fresh("mismatch"), slot()
    peer.endpoint("sub", topic, t, qos("reliable"))
    assert host.advertise(s, topic, t, qos("best_effort"))["code"] is None
    err = host.wait(lambda e: e.get("ev") == "error" and e["slot"] == s, timeout=5)
    assert err["kind"] == "pub" and err["code"] == "qos_incompatible"
    assert "(RELIABILITY)" in err["message"] and "RMW_" not in err["message"], err["message"]
    assert all(c == 0 for c in host.counts(s))
    # the other direction: a best_effort ROS publisher vs the client's reliable subscription
    topic2, s2 = fresh("mismatch_sub"), slot()
    peer.endpoint("pub", topic2, t, qos("best_effort"))
    assert host.subscribe(s2, topic2, t, qos("reliable"))["code"] is None
    err = host.wait(lambda e: e.get("ev") == "error" and e["slot"] == s2, timeout=5)
    assert err["kind"] == "sub" and err["code"] == "qos_incompatible"
    assert "(RELIABILITY)" in err["message"] and "RMW_" not in err["message"], err["message"]


# -- errors: the same codes from both backends ----------------------------------------------------
def test_errors_are_the_same_on_every_backend(pair):
    host, _ = pair
    t, q = "std_msgs/msg/String", qos()
    cases = [
        ("advertise", "chat~ter", t, q, "invalid_topic"),           # '~' not first
        ("advertise", "/a//b", t, q, "invalid_topic"),
        ("advertise", "/1abc", t, q, "invalid_topic"),
        ("advertise", "/x" * 130, t, q, "invalid_topic"),           # longer than 247
        ("advertise", "/e", "std_msgs/msg/Nope", q, "unknown_type"),
        ("advertise", "/e", "nopkg/msg/X", q, "unknown_type"),
        ("subscribe", "/e", "not a type", q, "unknown_type"),
        ("subscribe", "/e", "std_msgs/srv/X", q, "unknown_type"),
        ("advertise", "/e", t, {"reliability": "sometimes"}, "qos_conflict"),
        ("subscribe", "/e", t, {"depth": -1}, "qos_conflict"),
    ]
    for op, topic, ros_type, qq, _ in cases:
        getattr(host, op)(slot(), topic, ros_type, qq)
    got = [e for e in host.events if e.get("ev") == "result"][-len(cases):]
    assert [e["code"] for e in got] == [c[-1] for c in cases], got
    assert all(e["message"] for e in got)


# -- the ROS graph ------------------------------------------------------------------------------
def test_graph_shows_node_and_valid_type_hash(pair):
    """A Kilted rclpy peer sees our node ``ros_side`` with its publisher and subscription (``ros2
    node info``), and our endpoints with the ROS type hash it computes itself.

    rclpy backend: ``get_publishers_info_by_topic`` and ``get_subscriptions_info_by_topic`` name
    the node too. dds backend: they name ``_CREATED_BY_BARE_DDS_APP_`` (Fast DDS 3 files every
    Cyclone endpoint under participant gid 0; docs/COMPANION.md "Limit",
    ``test_graph_participant_repro_pins_the_upstream_cause``), asserted so that this test fails,
    and the note gets updated, once an upstream fix lands; the endpoint gids are our DDS GUIDs."""
    host, peer = pair
    if peer.kind != "rclpy":
        pytest.skip("the ROS graph API is rclpy's (the cyclone peer has none)")
    t, q = "sensor_msgs/msg/Image", qos()
    topic, topic_in, s, s_in = fresh("graph"), fresh("graph_in"), slot(), slot()
    k = peer.endpoint("sub", topic, t, q)
    assert host.advertise(s, topic, t, q)["code"] is None
    assert host.subscribe(s_in, topic_in, t, q)["code"] is None
    settle_counts(host, [s])

    def ours():
        g = peer.call("graph", topic=topic)
        node = g["by_node"].get("ros_side", {})
        return g if g["pubs"] and topic in node.get("pubs", ()) and topic_in in node.get(
            "subs", ()) else None
    g = wait_for(ours, 5)
    assert g, peer.call("graph", topic=topic)
    own = g["subs"][0]["hash"]                    # the peer's own subscription: rclpy's hash
    assert own.startswith("RIHS01_") and g["pubs"][0]["hash"] == own
    assert g["pubs"][0]["type"] == t
    ours_in = peer.call("graph", topic=topic_in)["subs"]     # only ours on that topic
    assert len(ours_in) == 1, ours_in
    named = {(e["node"], e["ns"]) for e in (g["pubs"][0], ours_in[0])}
    if host.backend == "rclpy":
        assert named == {("ros_side", "/")}
    else:
        assert named == {("_CREATED_BY_BARE_DDS_APP_", "_CREATED_BY_BARE_DDS_APP_")}
        assert host.call("guids", pub=s, sub=s_in) == {
            "pub": g["pubs"][0]["gid"], "sub": ours_in[0]["gid"], "re": ANY}
    peer.call("drop", id=k)


def test_graph_participant_repro_pins_the_upstream_cause():
    """tools/graph_participant_repro.py: a cyclonedds participant announcing its node with its
    own GUID as gid is shown as ``_CREATED_BY_BARE_DDS_APP_`` by a Kilted rclpy node, announcing
    gid 0 makes the node's name appear (docs/COMPANION.md, "Limit")."""
    require_ros()
    from ros_helpers import ROOT
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "graph_participant_repro.py"),
                        "--domain", str(TEST_DOMAIN)], env=ros_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    infos = [ln.split(": ")[-1] for ln in r.stdout.splitlines()
             if "get_publishers_info_by_topic" in ln]
    assert infos == ["_CREATED_BY_BARE_DDS_APP_", "repro"], r.stdout
    assert r.stdout.count("node repro publishes ['/repro_chatter']") == 2, r.stdout


def test_no_rtps_socket_beyond_loopback(pair):
    """Every UDP socket the ROS processes hold: Fast DDS's bound to 127.0.0.1; Cyclone's bound to
    127.0.0.1 or the wildcard (Cyclone binds its unicast sockets to 0.0.0.0 and only sends to the
    locators of its configured interface, lo); none to another address."""
    host, peer = pair
    for kind, proc in ((host.backend, host), (peer.kind, peer)):
        socks = udp_sockets(proc.proc.pid)
        assert socks, kind
        allowed = {"127.0.0.1"} if kind == "rclpy" else {"127.0.0.1", "0.0.0.0"}
        assert {a for a, _ in socks} <= allowed, (kind, socks)


# -- --backend auto -----------------------------------------------------------------------------
def test_backend_auto_picks_rclpy_where_it_runs_else_dds_saying_why():
    require_ros()
    env = ros_env()
    with_ros = Host("auto", env, python=ROS_PYTHON)
    try:
        assert with_ros.backend == "rclpy"
    finally:
        with_ros.close()
    without = Host("auto", env, python=sys.executable)
    try:
        assert without.backend == "dds"
    finally:
        without.close()
    why = [line for line in without.stderr if "backend auto: dds" in line]
    assert len(why) == 1 and "rclpy not usable" in why[0] and "No module named" in why[0]


# -- the rclpy backend's own wiring, on the real rclpy --------------------------------------------
RCLPY_WIRING = r"""
import argparse, sys, threading
sys.path.insert(0, sys.argv[1])
from ros_side.__main__ import declare_parameters
from ros_side.backends import make_backend
from ros_side.companion import SESSION_LINGER_MS, Companion

backend = make_backend("rclpy", domain=int(sys.argv[2]))
seen = []
node = backend.node
for name in ("create_publisher", "create_subscription", "destroy_publisher",
             "destroy_subscription", "declare_parameter"):
    def spy(*a, _f=getattr(node, name), _n=name, **kw):
        seen.append((_n, threading.current_thread() is backend._thread))
        return _f(*a, **kw)
    setattr(node, name, spy)
comp = Companion(backend, None, 1024, diagnostics_period_ms=0)
args = argparse.Namespace(link="udp://0.0.0.0:8269", baud=921600, listen=None,
                          no_diagnostics=False, msg_path=[])
declare_parameters(comp, args)
params = {n: node.get_parameter(n).value for n in ("link", "baud", "no_diagnostics")}
q = {"reliability": "reliable", "durability": "volatile", "depth": 10}
comp.advertise(1, "/w", "std_msgs/msg/String", q)
comp.subscribe(1, "/w2", "geometry_msgs/msg/Twist", q)
comp.poll(1000)  # (one past the companion's registration budget per poll waits for it)
comp.reset()     # (they linger for the gateway's next session, then go)
comp.poll(1000 + SESSION_LINGER_MS)
print(params == {"link": "udp://0.0.0.0:8269", "baud": 921600, "no_diagnostics": False},
      sorted({n for n, _ in seen}), all(on_executor for _, on_executor in seen))
comp.close()
"""


def test_rclpy_backend_flags_become_parameters_and_entities_live_on_the_executor():
    """`ros2 param get /ros_side link` shows the flags in effect; every entity is created and
    destroyed on the executor thread (rclpy races otherwise), on the real rclpy."""
    require_ros()
    from ros_helpers import ROOT
    r = subprocess.run([ROS_PYTHON, "-c", RCLPY_WIRING, ROOT, str(TEST_DOMAIN)], env=ros_env(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[0] == (
        "True ['create_publisher', 'create_subscription', 'declare_parameter', "
        "'destroy_publisher', 'destroy_subscription'] True"), r.stdout + r.stderr

"""A ROS 2 peer in its own process, driven by JSON lines on stdin (the tests' ``Peer`` class).

    .venv-ros/bin/python ros_peer.py rclpy    a real rclpy node (Kilted wheels, rmw_fastrtps_cpp)
    .venv/bin/python ros_peer.py cyclone      a plain cyclonedds participant (ROS wire conventions)

Both speak the same protocol, so the same test drives either kind of peer. Requests (one JSON
object a line, each answered by ``{"re": seq, ...}``):

    {"op": "pub"|"sub", "id": K, "topic": T, "type": "pkg/msg/T", "qos": {...}}
                                                   a ``sub`` may add "head": N: its events then
                                                   carry the first N bytes and "size" (a camera
                                                   stream's 30 MB/s is not hex-dumped)
    {"op": "write", "id": K, "data": HEX}          raw CDR (4-byte header included)
    {"op": "count", "id": K}                       matched peers of that endpoint (rclpy:
                                                   get_subscription_count / get_publisher_count)
    {"op": "acked", "id": K, "within": S}          a ``pub``: wait until every matched reliable
                                                   reader acknowledged all its samples (rclpy:
                                                   wait_for_all_acked; cyclone: wait_for_acks)
                                                   -> {"acked": bool}
    {"op": "drop", "id": K}                        delete that endpoint
    {"op": "graph", "topic": T}                    rclpy only: get_publishers_info_by_topic and
                                                   get_subscriptions_info_by_topic, the nodes
                                                   (names; "fqns": /ns/name) and their topics
    {"op": "quit"}

Events, unprompted: ``{"ev": "msg", "id": K, "data": HEX, "decoded": bool, "at": T}`` for every
sample a ``sub`` endpoint takes (``T``: its ``time.monotonic()`` then, the clock every process of
the machine shares) (rclpy: raw subscription, then ``deserialize_message`` to check that
rclpy can decode it), ``{"ev": "incompatible", "id": K, "total": N}`` for a QoS mismatch (rclpy's
incompatible-QoS event). Everything runs on one thread: select on stdin, then spin / take.
"""

import importlib
import os
import sys
import time

from jsonlines import Requests, out  # beside this script

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def msg_event(k, data, decoded, head):
    ev = {"ev": "msg", "id": k, "data": data[:head].hex() if head else data.hex(),
          "decoded": decoded, "at": time.monotonic()}
    if head:
        ev["size"] = len(data)
    return ev


class RclpyPeer:
    def __init__(self):
        import rclpy
        from rclpy.event_handler import PublisherEventCallbacks, SubscriptionEventCallbacks
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
        from rclpy.serialization import deserialize_message

        self.rclpy = rclpy
        self.deserialize = deserialize_message
        self.PubEv, self.SubEv = PublisherEventCallbacks, SubscriptionEventCallbacks
        self.QoSProfile, self.Rel, self.Dur, self.Hist = (QoSProfile, ReliabilityPolicy,
                                                          DurabilityPolicy, HistoryPolicy)
        rclpy.init()
        self.node = rclpy.create_node("ubrb_test_peer")
        self.ex = SingleThreadedExecutor()
        self.ex.add_node(self.node)
        self.ents = {}

    @staticmethod
    def msg_class(ros_type):
        pkg, _, name = ros_type.split("/")
        return getattr(importlib.import_module(pkg + ".msg"), name)

    def profile(self, q):
        return self.QoSProfile(
            history=self.Hist.KEEP_LAST, depth=max(1, q.get("depth", 10)),
            reliability=(self.Rel.BEST_EFFORT if q.get("reliability") == "best_effort"
                         else self.Rel.RELIABLE),
            durability=(self.Dur.TRANSIENT_LOCAL if q.get("durability") == "transient_local"
                        else self.Dur.VOLATILE))

    def create(self, kind, k, topic, ros_type, qos, head=None):
        cls = self.msg_class(ros_type)

        def incompatible(ev, k=k):
            out({"ev": "incompatible", "id": k, "total": ev.total_count})
        if kind == "pub":
            e = self.node.create_publisher(cls, topic, self.profile(qos),
                                           event_callbacks=self.PubEv(incompatible_qos=incompatible))
        else:
            def on_msg(data, *info, k=k, cls=cls):
                try:
                    self.deserialize(data, cls)
                    ok = True
                except Exception:
                    ok = False
                out(msg_event(k, data, ok, head))
            e = self.node.create_subscription(
                cls, topic, on_msg, self.profile(qos), raw=True,
                event_callbacks=self.SubEv(incompatible_qos=incompatible))
        self.ents[k] = (kind, e)

    def write(self, k, data):
        self.ents[k][1].publish(data)

    def count(self, k):
        kind, e = self.ents[k]
        return e.get_subscription_count() if kind == "pub" else e.get_publisher_count()

    def acked(self, k, timeout):
        from rclpy.duration import Duration
        return self.ents[k][1].wait_for_all_acked(Duration(seconds=timeout))

    def drop(self, k):
        kind, e = self.ents.pop(k)
        (self.node.destroy_publisher if kind == "pub" else self.node.destroy_subscription)(e)

    def graph(self, topic):
        def info(i):
            return {"node": i.node_name, "ns": i.node_namespace, "type": i.topic_type,
                    "gid": bytes(i.endpoint_gid).hex(),
                    "hash": str(i.topic_type_hash), "reliability": i.qos_profile.reliability.name,
                    "durability": i.qos_profile.durability.name}
        by_node = {}
        for name, ns in self.node.get_node_names_and_namespaces():
            try:
                pubs = self.node.get_publisher_names_and_types_by_node(name, ns)
                subs = self.node.get_subscriber_names_and_types_by_node(name, ns)
            except Exception:  # the node left meanwhile
                continue
            by_node[name] = {"pubs": sorted(t for t, _ in pubs), "subs": sorted(t for t, _ in subs)}
        return {"pubs": [info(i) for i in self.node.get_publishers_info_by_topic(topic)],
                "subs": [info(i) for i in self.node.get_subscriptions_info_by_topic(topic)],
                "nodes": sorted(self.node.get_node_names()), "by_node": by_node,
                "fqns": sorted(("" if ns == "/" else ns) + "/" + name
                               for name, ns in self.node.get_node_names_and_namespaces())}

    def spin(self):
        self.ex.spin_once(timeout_sec=0.005)

    def close(self):
        self.node.destroy_node()
        self.rclpy.shutdown()


class CyclonePeer:
    """Raw readers and writers on one cyclonedds participant, with the QoS rmw_cyclonedds uses.

    Its Cyclone configuration is CYCLONEDDS_URI plus the two settings any Cyclone node needs to
    interoperate with Fast DDS (``ros_side.backends.dds.build_config``; without them types with
    sequences or arrays do not match Fast DDS endpoints, and Fast DDS keeps counting deleted
    readers until the participant's lease ends): what a user's rmw_cyclonedds node would need too.
    """

    def __init__(self):
        sys.path.insert(0, ROOT)
        from cyclonedds.domain import Domain, DomainParticipant

        from ros_side.backends.dds import build_config, make_qos
        from ros_side.dds_types import TypeRegistry

        self.types = TypeRegistry("kilted")
        self.make_qos = make_qos
        domain = int(os.environ["ROS_DOMAIN_ID"])
        self.domain = Domain(domain, build_config() + os.environ.get("PEER_EXTRA_CONFIG", ""))
        self.dp = DomainParticipant(domain)
        self.ents = {}

    def create(self, kind, k, topic, ros_type, qos, head=None):
        from cyclonedds.pub import DataWriter
        from cyclonedds.sub import DataReader
        from cyclonedds.topic import Topic

        t = Topic(self.dp, "rt" + topic, self.types.idl_type(ros_type))
        h = self.types.type_hash(ros_type)
        if kind == "pub":
            e = DataWriter(self.dp, t, qos=self.make_qos(qos, True, h))
        else:
            e = DataReader(self.dp, t, qos=self.make_qos(qos, False, h))
        self.ents[k] = (kind, e, t, head)

    def write(self, k, data):
        from cyclonedds._clayer import ddspy_write
        if len(data) % 4:  # an RTPS payload is 4-aligned; say how much padding (XTypes 7.6.3.1.2)
            pad = -len(data) % 4
            data = bytearray(data + b"\0" * pad)
            data[3] |= pad
            data = bytes(data)
        ddspy_write(self.ents[k][1]._ref, data)

    def count(self, k):
        kind, e = self.ents[k][:2]
        if kind == "pub":
            return e.get_publication_matched_status().current_count
        return e.get_subscription_matched_status().current_count

    def acked(self, k, timeout):
        from cyclonedds.util import duration
        return bool(self.ents[k][1].wait_for_acks(duration(seconds=timeout)))

    def drop(self, k):
        self.ents.pop(k)[1].__del__()

    def graph(self, topic):
        raise RuntimeError("graph: rclpy peers only")

    def spin(self):
        from cyclonedds._clayer import ddspy_take
        for k, (kind, e, _, head) in list(self.ents.items()):
            if kind != "sub":
                continue
            got = ddspy_take(e._ref, 0xFFFF, 16)
            if isinstance(got, int):
                continue
            for data, info in got:
                if info.valid_data:
                    out(msg_event(k, data, True, head))
        time.sleep(0.002)

    def close(self):
        self.dp.__del__()


def main():
    peer = RclpyPeer() if sys.argv[1] == "rclpy" else CyclonePeer()
    out({"ev": "ready", "pid": os.getpid()})
    requests = Requests()
    while True:
        reqs, _ = requests.poll(0)
        if reqs is None:
            break
        for req in reqs:
            op = req["op"]
            if op == "quit":
                peer.close()
                out({"re": req["seq"]})
                return
            try:
                res = {}
                if op in ("pub", "sub"):
                    peer.create(op, req["id"], req["topic"], req["type"], req.get("qos", {}),
                                req.get("head"))
                elif op == "write":
                    peer.write(req["id"], bytes.fromhex(req["data"]))
                elif op == "count":
                    res["count"] = peer.count(req["id"])
                elif op == "acked":
                    res["acked"] = peer.acked(req["id"], req.get("within", 5.0))
                elif op == "drop":
                    peer.drop(req["id"])
                elif op == "graph":
                    res = peer.graph(req["topic"])
                out(dict(res, re=req["seq"]))
            except Exception as e:
                out({"re": req["seq"], "error": "%s: %s" % (type(e).__name__, e)})
        peer.spin()
    peer.close()


if __name__ == "__main__":
    main()

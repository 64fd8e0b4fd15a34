"""Backend ``dds``: ROS 2 on the wire with the PyPI cyclonedds binding, no ROS installation.

ROS 2 wire conventions (rmw_cyclonedds_cpp ``rmw_node.cpp``): DDS topic ``rt/<name>``, DDS type
``pkg::msg::dds_::Type_`` (see ``ros_side.dds_types``), keyless final types in XCDR1, and the QoS
that ``create_readwrite_qos`` produces:

=====================  =======================================================================
UBRB qos               DDS QoS
=====================  =======================================================================
depth N                HISTORY KEEP_LAST(N); N = 0 -> 1 (rmw refuses depth < 1 after
                       mapping RMW_QOS_POLICY_DEPTH_SYSTEM_DEFAULT (0) to 1)
reliable               RELIABILITY RELIABLE; readers max_blocking_time infinite (rmw's),
                       writers WRITE_BLOCK_MS (never reached: a KEEP_LAST writer does not
                       block, see make_qos)
best_effort            RELIABILITY BEST_EFFORT
volatile               DURABILITY VOLATILE
transient_local        DURABILITY TRANSIENT_LOCAL + DURABILITY_SERVICE(cleanup 0, KEEP_LAST(N),
                       unlimited, unlimited, unlimited): Cyclone serves late joiners from the
                       durability-service history, so it mirrors the history.
(always)               LIVELINESS AUTOMATIC(infinite), writer autodispose off,
                       DATA_REPRESENTATION XCDR1 only
Iron and later         USER_DATA ``typehash=RIHS01_<hex>;`` (rmw_dds_common's format)
=====================  =======================================================================

Raw CDR both ways, untouched, through cyclonedds-python's private C-extension calls (no public
raw API exists in 11.0.1, so the package version is pinned and the tests cover these calls):

* ``cyclonedds._clayer.ddspy_write(writer_entity: int, data: bytes-like) -> int`` — ``data`` is
  the complete serialized sample *including* the 4-byte encapsulation header; returns a DDS
  return code (< 0 on error).

  Padding. An RTPS DATA submessage carries its payload padded to a multiple of 4 and, in
  cyclonedds 11.0.1, without the exact length, so a reader in *another process* receives
  ``len`` rounded up to 4 — and, measured here, the extra bytes are whatever was in Cyclone's
  buffer, not zeros (fragmented samples, DATA_FRAG, carry the exact size and arrive exact;
  in-process readers always get the exact bytes). So ``publish`` does what cyclonedds' own
  ``DataWriter.write`` does: it appends 0-3 zero bytes when the length is not a multiple of 4,
  and records their number in the two low bits of the encapsulation options (XTypes 1.3,
  7.6.3.1.2), as Cyclone's own serializer does. A ROS 2 subscriber therefore gets the client's
  bytes followed by at most 3 zero bytes, with the header saying how many; CDR deserializers
  ignore them. A message whose length is a multiple of 4 passes unchanged. Bytes
  received from DDS are passed on exactly as they arrive.
* ``cyclonedds._clayer.ddspy_take(reader_entity: int, mask: int, n: int)`` -> list of
  ``(bytes, SampleInfo)`` or an ``int`` DDS error code; ``bytes`` include the 4-byte header.

Subscriptions are served by one WaitSet thread per backend (a ReadCondition per reader, a
GuardCondition to wake it), so Cyclone's receive threads never take the GIL; callbacks therefore
run on that thread.
"""

import logging
import os
import threading

from cyclonedds._clayer import ddspy_take, ddspy_write
from cyclonedds.core import (DDSException, GuardCondition, InstanceState, ReadCondition,
                             SampleState, ViewState, WaitSet)
from cyclonedds.domain import Domain, DomainParticipant
from cyclonedds.internal import dds_infinity
from cyclonedds.util import duration
from cyclonedds.pub import DataWriter
from cyclonedds.qos import Policy, Qos
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic

from ..dds_types import TypeRegistry
from ..errors import RosError
from ..names import dds_topic_name, normalize_type
from ..qos import normalize_qos

log = logging.getLogger("ros_side.dds")

# ROS-NOTES.md: keeps every packet on loopback; cross-process discovery still works.
LOOPBACK_XML = (
    '<CycloneDDS><Domain><General><Interfaces><NetworkInterface name="lo"/></Interfaces>'
    '<AllowMulticast>false</AllowMulticast></General><Discovery>'
    '<ParticipantIndex>auto</ParticipantIndex><MaxAutoParticipantIndex>50</MaxAutoParticipantIndex>'
    '<Peers><Peer address="127.0.0.1"/></Peers></Discovery></Domain></CycloneDDS>'
)

# Fast DDS (rmw_fastrtps, Kilted: Fast DDS 3.2) announces XTypes type information that
# cyclonedds 11.0.1 rejects for every type with a sequence or an array ("ddsi_xt_type_init_impl
# with invalid type object"); such endpoints then never match. ROS 2 matches by topic and type
# name only, so Cyclone is told to ignore the type information of eProsima's vendor id (1.15).
# Ghost subscriptions: when Cyclone deletes a reader or writer it announces that with a
# dispose/unregister of the endpoint's discovery (SEDP) instance, and by default without a key
# hash (PID_KEY_HASH): the key is only in the payload. Fast DDS looks up the endpoint to remove
# by the key hash alone, so it ignored the removal and kept counting the deleted reader as
# matched until our whole participant's lease expired. GenerateKeyhash puts the key hash in.
# Large samples (issue 21): a 640x480 rgb8 Image (921,600 B) at 30 Hz reached an rclpy node at
# 9-22 Hz, p50 0.3-1.1 s, images lost. Two causes, both in how Cyclone's writer meets a Fast DDS
# reader, and two settings:
# - Fragments: Cyclone's defaults cut a sample into 1,344-byte fragments in datagrams of at most
#   14,720 bytes (690 fragments, 63 datagrams an image); rmw_fastrtps, ROS 2's default, sends
#   ~64 KB fragments, one a datagram. The Fast DDS reader handles each fragment on its own;
#   with the fragment size rmw_fastrtps uses (and Cyclone's documentation advises for large
#   samples) an image is 15 datagrams, as a native publisher's.
# - Repair: a stock node's socket keeps Linux's default 208 KiB receive buffer, three 64 KB
#   datagrams on loopback, so a burst of 15 loses some (~800 datagrams in 4 s) whoever writes,
#   rmw_fastrtps too. Fast DDS asks again for the whole sample (ACKNACK; it sends no NACK_FRAG)
#   and Cyclone answers an ACKNACK of a fragmented sample with its first fragment only, so the
#   repair takes one heartbeat round per missing fragment: at Cyclone's 100 ms heartbeats
#   (20 ms scheduled at the least) an image stalled the stream ~330 ms until KEEP_LAST(10)
#   replaced it, lost. Heartbeats every 5 ms (1-2 ms at the least, backing off to 20 ms at most)
#   while data is unacknowledged repair it within a few ms: 120/120, p99 50-70 ms. Cyclone sends
#   no heartbeat once every reader has acknowledged, so an idle writer costs nothing more.
# The keys name every element a part sets: a user's configuration setting any of them keeps its
# own values for the whole part (a FragmentSize of ours above a MaxMessageSize of theirs would
# be refused).
_COMPAT_PARTS = {
    "IgnoreTypeInformation":
        "<Compatibility><IgnoreTypeInformation>1.15</IgnoreTypeInformation></Compatibility>",
    "GenerateKeyhash": "<Internal><GenerateKeyhash>true</GenerateKeyhash></Internal>",
    "MaxMessageSize FragmentSize": "<General><MaxMessageSize>65500B</MaxMessageSize>"
                                   "<FragmentSize>65000B</FragmentSize></General>",
    "HeartbeatInterval": '<Internal><HeartbeatInterval min="1ms" minsched="2ms" max="20ms">5ms'
                         "</HeartbeatInterval></Internal>",
}


def compat_xml(skip=()):
    """The Fast DDS settings as one Cyclone configuration, leaving out the parts in ``skip``."""
    parts = "".join(x for name, x in _COMPAT_PARTS.items() if name not in skip)
    return "<CycloneDDS><Domain>%s</Domain></CycloneDDS>" % parts if parts else ""


FASTDDS_COMPAT_XML = compat_xml()
_ANY = SampleState.Any | ViewState.Any | InstanceState.Any
_TAKE_BATCH = 32
_ZEROS = b"\0\0\0"
TOPICS_KEPT = 256  # unused DDS topics kept for reuse (DdsBackend._release_topic)
# A reliable writer's max_blocking_time. Our writers are KEEP_LAST, which Cyclone never throttles
# (see make_qos), so no write waits for it; it bounds what a write could ever cost the loop.
WRITE_BLOCK_MS = 5


def localhost_only(env=None):
    """True when the ROS 2 convention asks for loopback-only discovery.

    ``ROS_LOCALHOST_ONLY=1`` (Humble; deprecated in Jazzy) or
    ``ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST`` (Iron/Jazzy).
    """
    env = os.environ if env is None else env
    if env.get("ROS_LOCALHOST_ONLY", "").strip() == "1":
        return True
    return env.get("ROS_AUTOMATIC_DISCOVERY_RANGE", "").strip().upper() == "LOCALHOST"


def _config_text(uri):
    """The text of a CYCLONEDDS_URI (inline XML, or the files of ``file://`` entries) to inspect."""
    parts = []
    for item in uri.split(","):
        item = item.strip()
        if item.startswith("file://"):
            try:
                with open(item[len("file://"):], encoding="utf-8") as f:
                    parts.append(f.read())
            except OSError:
                pass
        else:
            parts.append(item)
    return "\n".join(parts)


def build_config(env=None):
    """The Cyclone configuration for the backend's domain.

    Base: the user's ``CYCLONEDDS_URI`` if set, else ``LOOPBACK_XML`` when ``localhost_only(env)``,
    else Cyclone's defaults. ``FASTDDS_COMPAT_XML`` is appended (Cyclone merges a comma-separated
    list of configurations in order), less any of its two elements the user's configuration
    already sets: the user's own value is kept.
    """
    env = os.environ if env is None else env
    user = env.get("CYCLONEDDS_URI", "").strip()
    if user:
        text = _config_text(user)
        extra = compat_xml(skip=[name for name in _COMPAT_PARTS
                                 if any(n in text for n in name.split())])
        return user + "," + extra if extra else user
    if localhost_only(env):
        return LOOPBACK_XML + "," + FASTDDS_COMPAT_XML
    return FASTDDS_COMPAT_XML


def default_domain(env=None):
    env = os.environ if env is None else env
    v = env.get("ROS_DOMAIN_ID", "").strip()
    return int(v) if v else 0


def make_qos(qos, writer, type_hash=None):
    """The DDS QoS rmw_cyclonedds would use for this UBRB qos (see the module docstring)."""
    reliable, transient_local, depth = normalize_qos(qos)
    # Writers are KEEP_LAST(depth), as an rclpy publisher with this QoS is (issue 21): a write
    # never waits for a reader. Cyclone 11.0.1 gives a KEEP_LAST writer watermarks of INT32_MAX
    # (ddsi_endpoint.c: "why bother blocking for a slow receiver when the entire point of
    # KEEP_LAST is to keep going"), so write() is never throttled, and a new sample replaces
    # the oldest one even when a reader has not acknowledged it (dds_whc.c, hdepth > 0). A
    # reader that stops acknowledging (a killed process, until its lease ends) therefore costs
    # its own topic at most `depth` samples of history. Before, the writer of a reliable
    # volatile topic was KEEP_ALL with max_blocking_time 1 s: such a reader filled the writer's
    # history to Cyclone's high-water mark, then every write blocked 1 s and timed out, and the
    # companion's loop -- every topic, the link -- stalled until the lease ended (~20 s for a
    # Fast DDS node). What the bridge accepted reaches the writer; from there it is DDS's
    # reliability within the history the QoS asks for, exactly as for a native node.
    # max_blocking_time: rmw_cyclonedds asks for infinity, rmw_fastrtps leaves Fast DDS's
    # 100 ms, Cyclone's own default is 100 ms; for a KEEP_LAST writer it only applies past
    # 2 GiB unacknowledged, and then WRITE_BLOCK_MS keeps the loop going (the write fails).
    pols = [
        Policy.History.KeepLast(depth),
        (Policy.Reliability.Reliable(
            max_blocking_time=duration(milliseconds=WRITE_BLOCK_MS) if writer else dds_infinity)
         if reliable else Policy.Reliability.BestEffort),
        Policy.Durability.TransientLocal if transient_local else Policy.Durability.Volatile,
        Policy.Liveliness.Automatic(lease_duration=dds_infinity),
        Policy.DataRepresentation(use_cdrv0_representation=True),
    ]
    if transient_local:
        pols.append(Policy.DurabilityService(
            cleanup_delay=0, history=Policy.History.KeepLast(depth),
            max_samples=-1, max_instances=-1, max_samples_per_instance=-1))
    if writer:
        pols.append(Policy.WriterDataLifecycle(autodispose=False))
    if type_hash:
        pols.append(Policy.Userdata(data=("typehash=%s;" % type_hash).encode("ascii")))
    return Qos(*pols)


# DDS 1.4 QoS policy ids (what Cyclone's incompatible-QoS statuses report), by DDS's names: the
# ones ROS has are rclpy's QoSPolicyKind names too (qos.policy_name, one vocabulary)
_POLICIES = {1: "USER_DATA", 2: "DURABILITY", 3: "PRESENTATION", 4: "DEADLINE",
             5: "LATENCY_BUDGET", 6: "OWNERSHIP", 8: "LIVELINESS", 11: "RELIABILITY",
             12: "DESTINATION_ORDER", 13: "HISTORY", 23: "DATA_REPRESENTATION"}


def policy_name(policy_id):
    return _POLICIES.get(policy_id, "policy %d" % policy_id)


def pad_to_4(data):
    """``data`` zero-padded to a multiple of 4, the pad count in the encapsulation options.

    See the module docstring: zeros, never Cyclone's uninitialised padding. XTypes 1.3,
    7.6.3.1.2: the two low bits of the encapsulation options count the padding bytes at the end,
    so a receiver can recover the exact length.
    """
    pad = -len(data) % 4
    if not pad:
        return data
    b = bytearray(data)
    b += _ZEROS[:pad]
    if len(b) >= 4 and not b[3] & 3:
        b[3] |= pad
    return bytes(b)


def _delete(entity):
    """Delete a cyclonedds entity now (the binding otherwise deletes on garbage collection)."""
    if entity is not None:
        try:
            entity.__del__()
        except Exception:  # pragma: no cover - already gone
            pass


class _Pub:
    __slots__ = ("topic", "type", "writer", "active")

    def __init__(self, topic, ros_type, writer):
        self.topic = topic
        self.type = ros_type
        self.writer = writer
        self.active = True


class _Sub:
    __slots__ = ("topic", "type", "reader", "cond", "callback", "handle_id", "active", "paused")

    def __init__(self, topic, ros_type, reader, cond, callback):
        self.topic = topic
        self.type = ros_type
        self.reader = reader
        self.cond = cond
        self.callback = callback
        self.handle_id = reader.instance_handle
        self.active = True
        self.paused = False  # the callback asked to stop taking (see resume_subscription)


class GraphAnnouncer:
    """Names this participant's endpoints in the ROS graph, as every rmw does.

    rmw implementations publish ``rmw_dds_common/msg/ParticipantEntitiesInfo`` on the DDS topic
    ``ros_discovery_info`` (no ``rt`` prefix; reliable, transient_local, keep_last 1): the
    participant's gid, and per node its name, namespace and the gids of its readers and writers.
    A gid is the 16-byte DDS GUID (prefix + entity id) zero-filled to ``Gid.data``'s length (16
    from Iron on, 24 before). Without it, ``ros2 node list`` / ``node info`` do not know our node.
    A Fast DDS 3 peer (Kilted) still names our endpoints ``_CREATED_BY_BARE_DDS_APP_`` in
    ``get_publishers_info_by_topic``: it files every Cyclone endpoint under participant gid 0
    (upstream; docs/COMPANION.md "Limit", tools/graph_participant_repro.py). The sample is
    written again after every change (transient_local: late joiners get the last one).
    """

    TYPE = "rmw_dds_common/msg/ParticipantEntitiesInfo"
    TOPIC = "ros_discovery_info"

    def __init__(self, dp, types, node_name, node_namespace="/"):
        self.types = types
        self.node = (node_namespace, node_name)
        self.gids = {"reader": [], "writer": []}
        self.writer = None
        S = types.store.types
        if self.TYPE not in S:  # pragma: no cover - every rosbags ROS 2 store has it
            log.warning("%s unknown to the %s typestore: not announcing node %s",
                        self.TYPE, types.distro, node_name)
            return
        self._Gid = S["rmw_dds_common/msg/Gid"]
        self._Node = S["rmw_dds_common/msg/NodeEntitiesInfo"]
        self._Info = S[self.TYPE]
        self._gid_len = self.types.store.fielddefs["rmw_dds_common/msg/Gid"][1][0][1][1][1]
        self._pgid = self._gid(dp)
        qos = make_qos({"reliability": "reliable", "durability": "transient_local", "depth": 1},
                       True, types.type_hash(self.TYPE))
        self.topic = Topic(dp, self.TOPIC, types.idl_type(self.TYPE))
        self.writer = DataWriter(dp, self.topic, qos=qos)
        self._write()

    def _gid(self, entity):
        import numpy as np
        raw = entity.guid.bytes.ljust(self._gid_len, b"\0")
        return self._Gid(data=np.frombuffer(raw, dtype=np.uint8))

    def add(self, kind, entity):
        if self.writer is not None:
            self.gids[kind].append((entity, self._gid(entity)))
            self._write()

    def remove(self, kind, entity):
        if self.writer is not None:
            self.gids[kind] = [(e, g) for e, g in self.gids[kind] if e is not entity]
            self._write()

    def _write(self):
        ns, name = self.node
        node = self._Node(node_namespace=ns, node_name=name,
                          reader_gid_seq=[g for _, g in self.gids["reader"]],
                          writer_gid_seq=[g for _, g in self.gids["writer"]])
        data = bytes(self.types.store.serialize_cdr(self._Info(gid=self._pgid,
                                                               node_entities_info_seq=[node]),
                                                    self.TYPE))
        ret = ddspy_write(self.writer._ref, pad_to_4(data))
        if ret < 0:  # pragma: no cover
            log.warning("could not write %s: DDS error %d", self.TOPIC, ret)

    def close(self):
        if self.writer is not None:
            self.gids = {"reader": [], "writer": []}
            _delete(self.writer)
            _delete(self.topic)
            self.writer = None


class DdsBackend:
    """Backend ``dds``. ``DdsBackend(domain=None, distro='humble', msg_paths=())``.

    ``domain`` None -> ``ROS_DOMAIN_ID`` else 0. The domain's configuration is ``build_config()``
    (loopback when ``localhost_only()``, Fast DDS type-information compatibility always).
    """

    name = "dds"

    def __init__(self, domain=None, distro="humble", msg_paths=(), types=None, config=None,
                 node_name="ros_side", node_namespace="/"):
        self.types = types if types is not None else TypeRegistry(distro, msg_paths)
        self.distro = self.types.distro
        for problem in self.types.problems:
            log.warning("--msg-path: %s", problem)
        self.domain_id = default_domain() if domain is None else int(domain)
        self._domain = self._make_domain(build_config() if config is None else config)
        # rmw sets "enclave=<name>;" in the participant's USER_DATA; rmw_fastrtps only adds a
        # participant with it to its graph (custom_participant_info.hpp, on_participant_discovery)
        self.dp = DomainParticipant(self.domain_id, qos=Qos(Policy.Userdata(data=b"enclave=/;")))
        self._lock = threading.RLock()
        self._topics = {}       # ros topic -> [Topic, ros_type, users]
        self._unused_topics = {}  # ros topic -> None: those with no users, oldest first
        self._subs = []         # live _Sub objects (the WaitSet thread iterates a snapshot)
        self._reader_ids = {}   # ros topic -> {reader instance handle} (own readers)
        self._ws = WaitSet(self.dp)
        self._wake = GuardCondition(self.dp)
        self._ws.attach(self._wake)
        self._running = True
        self.callback_errors = 0
        self._thread = threading.Thread(target=self._run, name="ros_side-dds-waitset", daemon=True)
        self._thread.start()
        self._graph = GraphAnnouncer(self.dp, self.types, node_name, node_namespace)

    def _make_domain(self, config):
        try:
            return Domain(self.domain_id, config)
        except DDSException as e:
            user = os.environ.get("CYCLONEDDS_URI", "").strip()
            if user and config.startswith(user + ","):
                log.warning("CYCLONEDDS_URI could not take the Fast DDS compatibility setting (%s); "
                            "using it as it is: message types with sequences or arrays will not "
                            "match rmw_fastrtps peers unless it sets <Compatibility>"
                            "<IgnoreTypeInformation>1.15</IgnoreTypeInformation>", e)
                try:
                    return Domain(self.domain_id, user)
                except DDSException as e2:
                    e = e2
            # e.g. the domain already exists in this process: it keeps its configuration
            log.warning("could not apply DDS config to domain %d: %s", self.domain_id, e)
            return None

    # -- helpers ----------------------------------------------------------------------------------
    def _acquire_topic(self, topic, ros_type):
        ent = self._topics.get(topic)
        if ent is not None:
            if ent[1] == ros_type:
                ent[2] += 1
                self._unused_topics.pop(topic, None)
                return ent[0]
            if ent[2] > 0:
                raise RosError("type_conflict", "%s already exists here with type %s"
                               % (topic, ent[1]))
            self._drop_topic(topic)     # unused: the new type takes its name
        idl = self.types.idl_type(ros_type)
        try:
            t = Topic(self.dp, dds_topic_name(topic), idl)
        except DDSException as e:
            raise RosError("type_conflict", "%s: cannot create DDS topic: %s" % (topic, e))
        self._topics[topic] = [t, ros_type, 1]
        return t

    def _release_topic(self, topic):
        # An unused DDS topic is kept (the last TOPICS_KEPT): Cyclone keeps ~80 bytes of every
        # topic created and deleted, so a client churning registrations grew the companion
        # without bound (issue 20).
        ent = self._topics.get(topic)
        if ent is None:
            return
        ent[2] -= 1
        if ent[2] <= 0:
            unused = self._unused_topics
            unused[topic] = None
            while len(unused) > TOPICS_KEPT:
                self._drop_topic(next(iter(unused)))

    def _drop_topic(self, topic):
        self._unused_topics.pop(topic, None)
        ent = self._topics.pop(topic, None)
        if ent is not None:
            _delete(ent[0])

    # -- Backend interface ------------------------------------------------------------------------
    def create_publisher(self, topic, type_string, qos):
        ros_type = normalize_type(type_string)
        try:
            dqos = make_qos(qos, True, self.types.type_hash(ros_type))
        except ValueError as e:
            raise RosError("qos_conflict", str(e))
        with self._lock:
            t = self._acquire_topic(topic, ros_type)
            try:
                w = DataWriter(self.dp, t, qos=dqos)
            except DDSException as e:
                self._release_topic(topic)
                raise RosError("qos_conflict", "%s: cannot create writer: %s" % (topic, e))
            self._graph.add("writer", w)
            return _Pub(topic, ros_type, w)

    def destroy_publisher(self, handle):
        with self._lock:
            if not handle.active:
                return
            handle.active = False
            self._graph.remove("writer", handle.writer)
            _delete(handle.writer)
            handle.writer = None
            self._release_topic(handle.topic)

    def publish(self, handle, data):
        w = handle.writer
        if w is None:
            return
        if len(data) & 3:                  # (per message: no call when nothing to pad)
            data = pad_to_4(data)
        ret = ddspy_write(w._ref, data)
        if ret < 0:
            raise DDSException(ret, "ddspy_write on %s" % handle.topic)

    def acked(self, handle, timeout_s=0.0):
        """Has every matched reliable reader acknowledged all this writer wrote? Waits up to
        ``timeout_s`` (0: just asks). The binding's ``DataWriter.wait_for_acks`` raises
        AttributeError instead of returning False on a timeout (cyclonedds-python 11.0.1 names
        ``Exception.DDS_RETCODE_TIMEOUT``), so its C call is made directly."""
        w = handle.writer
        if w is None:
            return True
        ret = w._wait_for_acks(w._ref, int(timeout_s * 1e9))
        if ret == DDSException.DDS_RETCODE_TIMEOUT:
            return False
        if ret < 0:
            raise DDSException(ret, "dds_wait_for_acks on %s" % handle.topic)
        return True

    def subscription_count(self, handle):
        """Matched readers of this writer, minus this participant's own readers."""
        w = handle.writer
        if w is None:
            return 0
        matched = w.get_matched_subscriptions()
        own = self._reader_ids.get(handle.topic)
        if not own:
            return len(matched)
        return sum(1 for h in matched if h not in own)

    def incompatible_qos(self, handle):
        """(total count, policy name) of DDS offered/requested-incompatible-QoS on this entity."""
        ent = handle.writer if isinstance(handle, _Pub) else handle.reader
        if ent is None:
            return 0, ""
        if isinstance(handle, _Pub):
            st = ent.get_offered_incompatible_qos_status()
        else:
            st = ent.get_requested_incompatible_qos_status()
        return st.total_count, policy_name(st.last_policy_id)

    def create_subscription(self, topic, type_string, qos, callback):
        ros_type = normalize_type(type_string)
        try:
            dqos = make_qos(qos, False, self.types.type_hash(ros_type))
        except ValueError as e:
            raise RosError("qos_conflict", str(e))
        with self._lock:
            t = self._acquire_topic(topic, ros_type)
            try:
                r = DataReader(self.dp, t, qos=dqos)
            except DDSException as e:
                self._release_topic(topic)
                raise RosError("qos_conflict", "%s: cannot create reader: %s" % (topic, e))
            cond = ReadCondition(r, _ANY)
            sub = _Sub(topic, ros_type, r, cond, callback)
            self._reader_ids.setdefault(topic, set()).add(sub.handle_id)
            self._subs = self._subs + [sub]
            self._ws.attach(cond)
            self._wake.set(True)
            self._graph.add("reader", r)
            return sub

    def destroy_subscription(self, handle):
        with self._lock:
            if not handle.active:
                return
            handle.active = False
            self._subs = [s for s in self._subs if s is not handle]
            ids = self._reader_ids.get(handle.topic)
            if ids is not None:
                ids.discard(handle.handle_id)
                if not ids:
                    del self._reader_ids[handle.topic]
            try:
                self._ws.detach(handle.cond)
            except Exception:  # pragma: no cover
                pass
            self._graph.remove("reader", handle.reader)
            _delete(handle.cond)
            _delete(handle.reader)
            handle.cond = handle.reader = None
            self._release_topic(handle.topic)

    def close(self):
        with self._lock:
            if not self._running:
                return
            self._running = False
            self._wake.set(True)
        self._thread.join(2.0)
        with self._lock:
            for s in list(self._subs):
                self.destroy_subscription(s)
            self._graph.close()
            _delete(self._wake)
            _delete(self._ws)
            _delete(self.dp)
            self._topics.clear()
            self._unused_topics.clear()
            self._domain = None

    # -- the WaitSet thread -----------------------------------------------------------------------
    def _run(self):
        ws = self._ws
        while self._running:
            try:
                ws.wait(dds_infinity)
            except DDSException:  # pragma: no cover - waitset deleted under us
                return
            self._wake.take()
            for sub in self._subs:  # a snapshot: the list is replaced, never mutated
                self._drain(sub)

    def _drain(self, sub):
        reader = sub.reader
        if reader is None or sub.paused:
            # (paused: its condition is detached, but the WaitSet wakes for the other readers
            # too, and a paused reader taken from then overshot the companion's bound by a
            # whole batch: tests/ros/test_companion_dds.py, 64 held for a bound of 8 + 32)
            return
        ref = reader._ref
        stop = False
        while sub.active and not stop:
            got = ddspy_take(ref, _ANY, _TAKE_BATCH)
            if isinstance(got, int) or not got:
                return  # error (e.g. reader deleted meanwhile) or nothing left
            for data, info in got:
                if info.valid_data and sub.active:
                    try:
                        if sub.callback(data) is False:
                            stop = True
                    except Exception:  # a callback must never kill the thread
                        self.callback_errors += 1
                        log.exception("subscription callback failed on %r", sub.topic)
            if len(got) < _TAKE_BATCH:
                break
        if stop:
            # The callback's consumer is full: take nothing more from this reader until
            # resume_subscription. The samples wait in the DDS reader (its history, as the
            # subscription's QoS says) and a reliable writer is held back by DDS itself.
            with self._lock:
                if sub.active and not sub.paused:
                    self._ws.detach(sub.cond)
                    sub.paused = True

    def resume_subscription(self, handle):
        """Take from a reader paused by its callback (returning False) again."""
        with self._lock:
            if handle.active and handle.paused:
                handle.paused = False
                self._ws.attach(handle.cond)
                self._wake.set(True)

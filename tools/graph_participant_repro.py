"""Reproducer: a Kilted rclpy node (rmw_fastrtps_cpp, Fast DDS 3.2) names the endpoints of a
cyclonedds participant ``_CREATED_BY_BARE_DDS_APP_``, although that participant announces its node
on ``ros_discovery_info`` as every rmw does.

    .venv/bin/python tools/graph_participant_repro.py [--domain N]     (needs make venv venv-ros)

Two runs, each: a cyclonedds participant (USER_DATA ``enclave=/;``, which rmw_fastrtps requires
of a ROS participant) with one writer on ``/repro_chatter`` that announces node ``repro`` owning
that writer (``rmw_dds_common/msg/ParticipantEntitiesInfo``), and a Kilted rclpy node in its own
process that prints what its graph says. Run 1 announces the participant's real GUID as its gid,
as rmw implementations do; run 2 announces the unknown GUID (all zeros). Seen with cyclonedds
11.0.1 and Fast DDS 3.2.3:

    gid = participant GUID: node list ['repro', ...]; node repro publishes ['/repro_chatter'];
                            get_publishers_info_by_topic: _CREATED_BY_BARE_DDS_APP_
    gid = all zeros:        ...; get_publishers_info_by_topic: repro

So rmw_fastrtps files every endpoint of a Cyclone participant under participant 0: Cyclone's
SEDP announcements carry no PID_PARTICIPANT_GUID (its ``sedp_write_endpoint_impl`` never adds
it, and no setting does), Fast DDS 3.2 fills ``participant_guid`` of a discovered endpoint only
from that parameter (``ReaderProxyData``/``WriterProxyData::read_from_cdr_message``; its
fallback to the endpoint GUID's prefix sets only the older ``m_rtps_participant_key``), and
rmw_fastrtps (Kilted) passes ``participant_guid`` to the graph cache
(``custom_participant_info.hpp: ParticipantListener::process_discovery_info``), whose
``__find_name_and_namespace_from_entity_gid`` then finds no participant. docs/COMPANION.md
explains why the companion does not announce itself under gid 0.

Loopback only: Cyclone on ``lo`` (``ros_side.backends.dds.LOOPBACK_XML``), Fast DDS with
``tests/ros/fastdds_loopback.xml``.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROS_PYTHON = os.path.join(ROOT, ".venv-ros", "bin", "python")
TOPIC = "/repro_chatter"


def observe(topic):
    """The rclpy side (run under .venv-ros): print what the graph says about ``topic``."""
    import rclpy
    rclpy.init()
    node = rclpy.create_node("repro_observer")
    end = time.monotonic() + 10
    while time.monotonic() < end:
        rclpy.spin_once(node, timeout_sec=0.1)
        names = [n for n, _ in node.get_node_names_and_namespaces()]
        infos = node.get_publishers_info_by_topic(topic)
        if "repro" in names and infos:
            break
    owned = (sorted(t for t, _ in node.get_publisher_names_and_types_by_node("repro", "/"))
             if "repro" in names else [])
    print(json.dumps({"nodes": sorted(names), "repro_publishes": owned,
                      "info_nodes": [i.node_name for i in infos]}))
    node.destroy_node()
    rclpy.shutdown()


def announce_and_observe(domain, zero_gid):
    from cyclonedds.domain import Domain, DomainParticipant
    from cyclonedds.idl import IdlStruct
    from cyclonedds.idl.types import array, sequence, uint8
    from cyclonedds.pub import DataWriter
    from cyclonedds.qos import Policy, Qos
    from cyclonedds.topic import Topic

    sys.path.insert(0, ROOT)
    from ros_side.backends.dds import FASTDDS_COMPAT_XML, LOOPBACK_XML

    @dataclass
    class Gid(IdlStruct, typename="rmw_dds_common::msg::dds_::Gid_"):
        data: array[uint8, 16]

    @dataclass
    class NodeEntitiesInfo(IdlStruct, typename="rmw_dds_common::msg::dds_::NodeEntitiesInfo_"):
        node_namespace: str
        node_name: str
        reader_gid_seq: sequence[Gid]
        writer_gid_seq: sequence[Gid]

    @dataclass
    class ParticipantEntitiesInfo(IdlStruct,
                                  typename="rmw_dds_common::msg::dds_::ParticipantEntitiesInfo_"):
        gid: Gid
        node_entities_info_seq: sequence[NodeEntitiesInfo]

    @dataclass
    class String(IdlStruct, typename="std_msgs::msg::dds_::String_"):
        data: str

    # IgnoreTypeInformation: without it Cyclone cannot match rmw_fastrtps' ros_discovery_info
    # reader (a type with sequences; docs/COMPANION.md). Keep the Domain referenced: deleting it
    # would leave the participant on Cyclone's defaults (every interface, multicast).
    os.environ["CYCLONEDDS_URI"] = LOOPBACK_XML + "," + FASTDDS_COMPAT_XML   # for any domain
    config = Domain(domain, os.environ["CYCLONEDDS_URI"])
    dp = DomainParticipant(domain, qos=Qos(Policy.Userdata(data=b"enclave=/;")))
    writer = DataWriter(dp, Topic(dp, "rt" + TOPIC, String))
    latched = Qos(Policy.Reliability.Reliable(0), Policy.Durability.TransientLocal,
                  Policy.History.KeepLast(1))
    graph = DataWriter(dp, Topic(dp, "ros_discovery_info", ParticipantEntitiesInfo), qos=latched)
    pgid = bytes(16) if zero_gid else dp.guid.bytes
    graph.write(ParticipantEntitiesInfo(
        gid=Gid(list(pgid)),
        node_entities_info_seq=[NodeEntitiesInfo("/", "repro", [], [Gid(list(writer.guid.bytes))])]))
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain),
               FASTDDS_DEFAULT_PROFILES_FILE=os.path.join(ROOT, "tests", "ros",
                                                          "fastdds_loopback.xml"))
    r = subprocess.run([ROS_PYTHON, os.path.abspath(__file__), "--observe", TOPIC], env=env,
                       capture_output=True, text=True, timeout=60)
    if r.returncode:
        raise SystemExit("the rclpy observer failed:\n" + r.stderr)
    dp.__del__()
    config.__del__()
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    sys.path[:0] = [ROOT, os.path.join(ROOT, "ports", "cpython")]  # ubrb_min, ubrb_host
    from ubrb_host import cli as host_cli

    ap = host_cli.script_parser("tools/graph_participant_repro.py", __doc__ or "")
    ap.add_argument("--domain", type=host_cli.domain_id, default=100 + os.getpid() % 120)
    ap.add_argument("--gid", choices=("real", "zero"), help="one run only (default: both)")
    ap.add_argument("--observe", metavar="TOPIC", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.observe:
        observe(a.observe)
    elif a.gid:
        got = announce_and_observe(a.domain, a.gid == "zero")
        print("%-24s node list %s; node repro publishes %s;\n%24s get_publishers_info_by_topic: %s"
              % ("gid = participant GUID:" if a.gid == "real" else "gid = all zeros:",
                 got["nodes"], got["repro_publishes"], "", ", ".join(got["info_nodes"]) or "-"),
              flush=True)
    else:  # each run in a process of its own (a process applies one Cyclone config per domain)
        for gid in ("real", "zero"):
            subprocess.run([sys.executable, os.path.abspath(__file__), "--domain", str(a.domain),
                            "--gid", gid], check=True)


if __name__ == "__main__":
    main()

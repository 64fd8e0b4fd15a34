"""UBRB QoS dicts, normalised the same way for every backend.

``{"reliability": "reliable"|"best_effort", "durability": "volatile"|"transient_local",
"depth": N}``; history is always KEEP_LAST(depth). Missing keys take ROS 2's default profile
(reliable, volatile, depth 10). Depth 0 becomes 1, as in rmw (depth 0 is
``RMW_QOS_POLICY_DEPTH_SYSTEM_DEFAULT``, which rmw_cyclonedds maps to KEEP_LAST(1)), so two
registrations that differ only by 0 vs 1 are the same QoS on the wire and do not conflict.
A value outside these is refused with ``qos_conflict`` (the spec has no "invalid qos" code).
"""

from .errors import RosError

DEFAULT = {"reliability": "reliable", "durability": "volatile", "depth": 10}


def normalize_qos(qos):
    """-> (reliable: bool, transient_local: bool, depth >= 1); ValueError when not valid."""
    qos = qos or {}
    rel = qos.get("reliability", "reliable")
    dur = qos.get("durability", "volatile")
    depth = qos.get("depth", 10)
    if rel not in ("reliable", "best_effort"):
        raise ValueError("reliability must be 'reliable' or 'best_effort', not %r" % (rel,))
    if dur not in ("volatile", "transient_local"):
        raise ValueError("durability must be 'volatile' or 'transient_local', not %r" % (dur,))
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0 or depth > 0x7FFFFFFF:
        raise ValueError("depth must be an integer 0..2**31-1, not %r" % (depth,))
    return rel == "reliable", dur == "transient_local", max(1, depth)


def check_qos(qos):
    """normalize_qos, raising RosError('qos_conflict') instead of ValueError."""
    try:
        return normalize_qos(qos)
    except ValueError as e:
        raise RosError("qos_conflict", "unsupported qos: %s" % e)


def qos_dict(norm):
    """The normalised tuple back as a UBRB qos dict."""
    reliable, transient_local, depth = norm
    return {"reliability": "reliable" if reliable else "best_effort",
            "durability": "transient_local" if transient_local else "volatile",
            "depth": depth}


# rclpy.qos.QoSPolicyKind, by value (rmw_qos_policy_kind_t): the names `ros2 topic info -v`,
# rclpy's QoS warnings and a ROS user's code use.
ROS_POLICY_NAMES = ("INVALID", "DURABILITY", "DEADLINE", "LIVELINESS", "RELIABILITY", "HISTORY",
                    "LIFESPAN", "DEPTH", "LIVELINESS_LEASE_DURATION",
                    "AVOID_ROS_NAMESPACE_CONVENTIONS")
_RMW_PREFIX = "RMW_QOS_POLICY_"


def policy_name(kind):
    """One vocabulary for the policy a ``qos_incompatible`` names, on every backend: rclpy's
    QoSPolicyKind names ("RELIABILITY", "DURABILITY", ...). ``kind``: an rmw policy kind (an int,
    or rclpy's event status value, whose own name is "RMW_QOS_POLICY_RELIABILITY") or a name
    already (DDS policy names that ROS has are spelled the same; the others, e.g.
    DATA_REPRESENTATION, stay DDS's, as ROS has no name for them)."""
    if not isinstance(kind, str):
        try:
            value = int(kind)
        except (TypeError, ValueError):
            value = None
        if value is not None and 0 <= value < len(ROS_POLICY_NAMES):
            return ROS_POLICY_NAMES[value]
        kind = getattr(kind, "name", str(kind))
    kind = str(kind)
    if kind.startswith(_RMW_PREFIX):
        kind = kind[len(_RMW_PREFIX):]
    return kind

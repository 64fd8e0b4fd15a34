"""ROS 2 name rules: absolute topic names and message type strings.

Topic names
-----------
A UBRB client sends an already fully-qualified topic name (no node, no namespace, no remapping),
so the rule that applies is rmw's check of a *full* topic name, which rcl runs on every name it
hands to the middleware (rcl ``rcl_expand_topic_name`` removes ``~`` and ``{}`` substitutions first;
in a full name those characters are simply unallowed). This module follows, check by check and in
the same order, ``rmw_validate_full_topic_name`` (ros2/rmw ``rmw/src/validate_full_topic_name.c``,
unchanged from Foxy to Jazzy):

1. not empty;
2. starts with ``/`` (absolute);
3. does not end with ``/`` (this also rejects ``/`` itself);
4. only ``[A-Za-z0-9_/]`` (``rcutils_isalnum_no_locale``: ASCII only);
5. no ``//``; a token (the text after a ``/``) does not start with a digit;
6. length at most ``RMW_TOPIC_MAX_NAME_LENGTH`` = 255 ("impl constraint") - 8 ("reserved for
   prefixes") = 247 characters (``rmw/include/rmw/validate_full_topic_name.h``).

rclpy's ``validate_full_topic_name`` raises ``InvalidTopicNameException`` for any of these results,
including "too long", and ``rmw_create_publisher`` refuses all of them, so every one is an
``invalid_topic`` here. The messages are rmw's own (``rmw_full_topic_name_validation_result_string``).

Type strings
------------
Canonical form ``pkg/msg/Type`` (what ``ros2 topic list -t`` prints and what
``rosidl_runtime_py.utilities.get_message`` takes). Decision: the two-part shorthand ``pkg/Type``
(accepted by the ``ros2 topic`` command line) is also accepted and normalised to ``pkg/msg/Type``
before anything else looks at it, so type comparisons (``type_conflict``) and both backends see one
spelling. The parts follow rosidl_adapter's patterns (``rosidl_adapter/parser.py``):
package ``^(?!.*__)(?!.*_$)[a-z][a-z0-9_]*$``, message ``^[A-Z][A-Za-z0-9]*$``. Anything else is
``unknown_type`` ("the type string is malformed"); whether a well-formed type exists is the
backend's question.
"""

import re

from .errors import RosError

# rmw/include/rmw/validate_full_topic_name.h: 255U /* impl constraint */ - 8U /* reserved for prefixes */
RMW_TOPIC_MAX_NAME_LENGTH = 255 - 8

_ALLOWED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_/")
_DIGITS = frozenset("0123456789")

_PKG_RE = re.compile(r"^(?!.*__)(?!.*_$)[a-z][a-z0-9_]*$")
_MSG_RE = re.compile(r"^[A-Z][A-Za-z0-9]*$")


def full_topic_name_error(name):
    """None if ``name`` is a valid fully-qualified ROS 2 topic name, else rmw's reason string."""
    if not isinstance(name, str):
        return "topic name must be a string"
    n = len(name)
    if n == 0:
        return "topic name must not be empty"
    if name[0] != "/":
        return "topic name must be absolute, it must lead with a '/'"
    if name[n - 1] == "/":
        return "topic name must not end with a '/'"
    for ch in name:
        if ch not in _ALLOWED:
            return ("topic name must not contain characters other than alphanumerics, '_', "
                    "or '/'")
    for i in range(n - 1):
        if name[i] == "/":
            nxt = name[i + 1]
            if nxt == "/":
                return "topic name must not contain repeated '/'"
            if nxt in _DIGITS:
                return "topic name must not have a token that starts with a number"
    if n > RMW_TOPIC_MAX_NAME_LENGTH:
        return "topic length should not exceed '%d'" % RMW_TOPIC_MAX_NAME_LENGTH
    return None


def check_topic(name):
    """Return ``name`` if valid, else raise ``RosError('invalid_topic', reason)``."""
    err = full_topic_name_error(name)
    if err is not None:
        raise RosError("invalid_topic", "%r: %s" % (name, err))
    return name


def normalize_type(type_string):
    """``pkg/msg/Type`` (or ``pkg/Type``) -> ``pkg/msg/Type``; malformed -> RosError unknown_type."""
    if not isinstance(type_string, str):
        raise RosError("unknown_type", "type must be a string")
    parts = type_string.split("/")
    if len(parts) == 2:
        parts = [parts[0], "msg", parts[1]]
    if len(parts) != 3 or parts[1] != "msg":
        raise RosError("unknown_type", "%r: expected 'pkg/msg/Type'" % (type_string,))
    if not _PKG_RE.match(parts[0]):
        raise RosError("unknown_type", "%r: invalid package name %r" % (type_string, parts[0]))
    if not _MSG_RE.match(parts[2]):
        raise RosError("unknown_type", "%r: invalid message name %r" % (type_string, parts[2]))
    return "/".join(parts)


def dds_topic_name(topic):
    """ROS topic ``/a/b`` -> DDS topic ``rt/a/b`` (rmw_cyclonedds/rmw_fastrtps ``ros_topic_prefix``)."""
    return "rt" + topic


def dds_type_name(ros_type):
    """``pkg/msg/Type`` -> ``pkg::msg::dds_::Type_`` (rosidl_typesupport naming on the DDS wire)."""
    pkg, sub, name = ros_type.split("/")
    return "%s::%s::dds_::%s_" % (pkg, sub, name)

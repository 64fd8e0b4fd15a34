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


# -- name resolution: node, namespace, remapping ----------------------------------------------
# A UBRB client may also send a relative (``odom``) or private (``~/odom``) name: the companion
# resolves it as rcl resolves a node's names (``rcl_node_resolve_name``: expand, then remap), so
# that both backends hand the middleware the same absolute name, and a companion put under a
# namespace (``--namespace``, ``-r __ns:=``) behaves as a native node there would:
#
# * expansion (``rcl/src/rcl/expand_topic_name.c``): a leading ``~`` becomes the node's fully
#   qualified name (``/ns/node``); ``{node}``, ``{ns}`` and ``{namespace}`` are substituted; a
#   name that is still relative gets the namespace in front; absolute names stay as they are;
# * remapping (``rcl/src/rcl/remap.c``): the first rule whose match, expanded the same way,
#   equals the expanded name replaces it with its expanded replacement; a rule with a node prefix
#   (``ros_side:from:=to``) applies only to a node of that name; ``rosservice://`` rules only to
#   services (the companion has none), ``rostopic://`` ones only to topics;
# * ``__node:=NAME`` / ``__name:=NAME`` and ``__ns:=/NS`` rename the node and move it (the
#   first such rule wins; a namespace replacement must be absolute, as rcl insists).
# ``tests/ros/test_names.py`` checks the results against rclpy's own ``Node.resolve_topic_name``.

_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_SUBST = ("node", "ns", "namespace")
_RULE_NAME_RE = re.compile(r"^(?:/|~/)?[A-Za-z_][A-Za-z0-9_]*(?:/[A-Za-z_][A-Za-z0-9_]*)*$")
# rmw/include/rmw/validate_namespace.h: RMW_NAMESPACE_MAX_LENGTH = RMW_TOPIC_MAX_NAME_LENGTH - 2
RMW_NAMESPACE_MAX_LENGTH = RMW_TOPIC_MAX_NAME_LENGTH - 2
RMW_NODE_NAME_MAX_NAME_LENGTH = 255


def node_name_error(name):
    """None if ``name`` is a valid ROS 2 node name (``rmw_validate_node_name``), else why not."""
    if not name:
        return "node name must not be empty"
    if any(ch not in _NAME_CHARS for ch in name):
        return "node name must not contain characters other than alphanumerics or '_'"
    if name[0] in _DIGITS:
        return "node name must not start with a number"
    if len(name) > RMW_NODE_NAME_MAX_NAME_LENGTH:
        return "node name should not exceed '%d'" % RMW_NODE_NAME_MAX_NAME_LENGTH
    return None


def namespace_error(ns):
    """None if ``ns`` is a valid absolute namespace (``rmw_validate_namespace``), else why not."""
    if ns == "/":
        return None
    err = full_topic_name_error(ns)
    if err is not None:
        return err.replace("topic name", "namespace").replace("topic length", "namespace length")
    if len(ns) > RMW_NAMESPACE_MAX_LENGTH:
        return "namespace should not exceed '%d'" % RMW_NAMESPACE_MAX_LENGTH
    return None


def normalize_namespace(ns):
    """``robot1`` -> ``/robot1`` (rcl_node_init puts a relative namespace under ``/``; empty is
    ``/``); ValueError when it is not a valid namespace then."""
    ns = "/" + ns if not ns.startswith("/") else ns
    err = namespace_error(ns)
    if err is not None:
        raise ValueError("%r: %s" % (ns, err))
    return ns


def _topic_syntax_error(name):
    """None if ``name`` may be expanded (rcl_validate_topic_name's checks that expansion cannot
    fix: characters, ``~`` placement, substitutions), else why not."""
    if not isinstance(name, str):
        return "topic name must be a string"
    if not name:
        return "topic name must not be empty"
    i, n = 0, len(name)
    while i < n:
        ch = name[i]
        if ch == "~":
            if i:
                return "'~' is only allowed at the start of a topic name"
        elif ch == "{":
            end = name.find("}", i)
            if end < 0:
                return "topic name has an unmatched '{'"
            key = name[i + 1:end]
            if key not in _SUBST:
                return "unknown substitution {%s} (rcl knows {node}, {ns}, {namespace})" % key
            i = end
        elif ch == "}":
            return "topic name has an unmatched '}'"
        elif ch not in _ALLOWED:
            return ("topic name must not contain characters other than alphanumerics, '_', '/', "
                    "'~', or a substitution")
        i += 1
    return None


def parse_remap(rule):
    """``[node:]from:=to`` -> (node or None, kind, from, to), kind ``topic``, ``service``,
    ``node`` or ``namespace``; ValueError (rcl's reason, in words) when it is not a rule rcl
    accepts."""
    if not isinstance(rule, str) or ":=" not in rule:
        raise ValueError("%r: a remap rule is FROM:=TO (e.g. /odom:=/robot1/odom)" % (rule,))
    head, _, to = rule.partition(":=")
    node = None
    scheme = ""
    for prefix in ("rostopic://", "rosservice://"):
        at = head.find(prefix)
        if at >= 0:
            scheme, node = prefix, head[:at] or None
            head = head[at + len(prefix):]
            break
    else:
        if ":" in head:
            node, _, head = head.partition(":")
    if node is not None:
        if node.endswith(":"):
            node = node[:-1]
        err = node_name_error(node)
        if err is not None:
            raise ValueError("%r: its node prefix %r: %s" % (rule, node, err))
    if "*" in head or "*" in to:
        raise ValueError("%r: wildcards ('*', '**') are not implemented by rcl either" % rule)
    if head in ("__node", "__name"):
        err = node_name_error(to)
        if err is not None:
            raise ValueError("%r: %s" % (rule, err))
        return node, "node", head, to
    if head == "__ns":
        if not to.startswith("/"):
            raise ValueError("%r: the namespace must be absolute (start with '/'), as rcl "
                             "insists" % rule)
        err = namespace_error(to)
        if err is not None:
            raise ValueError("%r: %s" % (rule, err))
        return node, "namespace", head, to
    if head.startswith("__"):
        raise ValueError("%r: unknown special name %r (rcl knows __node, __name, __ns)"
                         % (rule, head))
    for part in (head, to):  # rcl's remap grammar: [/ or ~/]token/token..., no substitutions
        if not _RULE_NAME_RE.match(part):
            raise ValueError("%r: %r is not a name a remap rule can hold (tokens of "
                             "[A-Za-z0-9_] not starting with a digit, separated by '/', "
                             "optionally after '/' or '~/')" % (rule, part))
    return node, "service" if scheme == "rosservice://" else "topic", head, to


class Names:
    """The companion's node name and namespace and its remap rules: ``resolve(name)`` gives the
    absolute topic name a client's name stands for, as rcl would resolve it for this node.

    ``Names(node, namespace, rules)``: ``node`` and ``namespace`` as the program asks for them
    (``--node-name``, ``--namespace``), ``rules`` the remap rules in order (``--remap``,
    ``--ros-args -r``); ``__node``/``__ns`` rules override the first two, as they do in rcl.
    ValueError when one of them is not valid.
    """

    def __init__(self, node="ros_side", namespace="/", rules=()):
        err = node_name_error(node)
        if err is not None:
            raise ValueError("%r: %s" % (node, err))
        ns = normalize_namespace(namespace or "/")
        parsed = [parse_remap(r) for r in rules]
        original = node
        for prefix, kind, _, to in parsed:     # rcl_remap_node_name: the first match wins
            if kind == "node" and prefix in (None, original):
                node = to
                break
        for prefix, kind, _, to in parsed:     # rcl_remap_node_namespace: matched by the
            if kind == "namespace" and prefix in (None, original):   # original name too
                ns = to
                break
        self.node = node
        self.namespace = ns
        self.rules = [(p, f, t) for p, kind, f, t in parsed if kind == "topic"]

    @property
    def fqn(self):
        """``/robot1/ros_side``: the node's fully qualified name (what ``ros2 node list`` shows)."""
        return ("" if self.namespace == "/" else self.namespace) + "/" + self.node

    def expand(self, name):
        """rcl_expand_topic_name; RosError invalid_topic when ``name`` cannot be expanded."""
        err = _topic_syntax_error(name)
        if err is not None:
            raise RosError("invalid_topic", "%r: %s" % (name, err))
        ns = self.namespace
        if name.startswith("~"):
            name = self.fqn + name[1:]
        if "{" in name:
            name = (name.replace("{node}", self.node).replace("{namespace}", ns)
                    .replace("{ns}", ns))
        if not name.startswith("/"):
            name = ("/" if ns == "/" else ns + "/") + name
        return name

    def resolve(self, name):
        """The absolute topic name ``name`` stands for (expanded, then remapped), checked as a
        full topic name; RosError invalid_topic naming what the client sent."""
        full = self.expand(name)
        for prefix, match, replacement in self.rules:
            if prefix is not None and prefix != self.node:
                continue
            try:
                if self.expand(match) == full:
                    full = self.expand(replacement)
                    break
            except RosError:   # a rule that cannot expand here (checked when parsed) never matches
                continue
        err = full_topic_name_error(full)
        if err is not None:
            if full == name:
                raise RosError("invalid_topic", "%r: %s" % (name, err))
            raise RosError("invalid_topic", "%r (resolved to %r): %s" % (name, full, err))
        return full

import pytest

from ros_side.errors import RosError
from ros_side.names import (RMW_TOPIC_MAX_NAME_LENGTH, check_topic, dds_topic_name,
                            dds_type_name, full_topic_name_error, normalize_type)

VALID = ["/chatter", "/a/b/c", "/_hidden", "/a_1/b2", "/tf_static", "/A/B", "/x" * 1,
         "/" + "a" * (RMW_TOPIC_MAX_NAME_LENGTH - 1), "/a__b", "/_", "/a/_1"]

INVALID = {
    "": "empty",
    "chatter": "absolute",
    "~/chatter": "absolute",
    "/": "end with",
    "/chatter/": "end with",
    "/a//b": "repeated",
    "/1abc": "number",
    "/a/9b": "number",
    "/a b": "characters",
    "/a-b": "characters",
    "/a.b": "characters",
    "/{node}/x": "characters",
    "/~/x": "characters",
    "/ä": "characters",
    "/a\x00": "characters",
    "/" + "a" * RMW_TOPIC_MAX_NAME_LENGTH: "exceed",
}


def test_max_length_is_rmw_constant():
    assert RMW_TOPIC_MAX_NAME_LENGTH == 247


@pytest.mark.parametrize("name", VALID)
def test_valid_topics(name):
    assert full_topic_name_error(name) is None
    assert check_topic(name) == name


@pytest.mark.parametrize("name,why", sorted(INVALID.items()))
def test_invalid_topics(name, why):
    err = full_topic_name_error(name)
    assert err is not None and why in err
    with pytest.raises(RosError) as ei:
        check_topic(name)
    assert ei.value.code == "invalid_topic"


def test_rmw_check_order():
    # "too long" is checked last, like rmw: a long name with a bad character reports the character
    assert "characters" in full_topic_name_error("/" + "a" * 300 + "-")
    assert full_topic_name_error(None) is not None


@pytest.mark.parametrize("t,norm", [
    ("std_msgs/msg/String", "std_msgs/msg/String"),
    ("std_msgs/String", "std_msgs/msg/String"),
    ("tf2_msgs/msg/TFMessage", "tf2_msgs/msg/TFMessage"),
])
def test_type_normalize(t, norm):
    assert normalize_type(t) == norm


@pytest.mark.parametrize("t", ["", "String", "std_msgs/srv/SetBool", "std_msgs//String",
                               "std_msgs/msg/string", "Std_msgs/msg/String", "std__msgs/msg/X",
                               "std_msgs_/msg/X", "a/b/c/d", "std_msgs/msg/Str-ing", None, 5])
def test_type_malformed(t):
    with pytest.raises(RosError) as ei:
        normalize_type(t)
    assert ei.value.code == "unknown_type"


def test_dds_names():
    assert dds_topic_name("/a/b") == "rt/a/b"
    assert dds_type_name("geometry_msgs/msg/Twist") == "geometry_msgs::msg::dds_::Twist_"


# -- resolution: namespace, private names, remapping (issue 21, item 8) -------------------------
from ros_side.names import Names, parse_remap  # noqa: E402

# (node, namespace, rules): what a companion may be started with
RESOLVE_CASES = [
    ("ros_side", "/", []),
    ("ros_side", "/robot1", ["/odom:=/robot1/odom", "scan:=laser", "ros_side:chat:=talk",
                             "other:x:=y", "~/p:=q", "rostopic://a:=b", "rosservice://x:=z"]),
    ("ros_side", "/", ["__ns:=/r2", "__node:=bob", "bob:a:=c", "ros_side:odom:=o2", "a:=d"]),
    ("n1", "/a/b", ["~/q:=/priv", "/odom:=odom2", "odom2:=odom3", "q:=~/r", "/x/y:=~/z"]),
    ("n1", "/", ["n1:__ns:=/x", "other:__node:=q", "__ns:=/y"]),
    ("n1", "/", ["__node:=n2", "n1:a:=b", "n2:x:=w"]),
]
# what UBRB clients may send: absolute, relative, private, substitutions, and mistakes
CLIENT_NAMES = ["/odom", "odom", "scan", "chat", "x", "~", "~/p", "p", "{node}/a", "{ns}/b",
                "/robot1/scan", "a", "{namespace}", "~x", "1a", "a/1b", "/a//b", "a/", "",
                "a b", "/{node}", "b/{node}/c", "ros_side", "a~", "odom2", "q", "~/q", "/x/y",
                "{bogus}", "a}", "/tf_static", "robot1/odom"]
RULES = ["{node}/a:=b", "a:={node}/b", "~:=/p", "~/p:=q", "a:=~/q", "a:=~", "/a:=/b/", "a/:=b",
         "1a:=b", "a:=1b", "/a//b:=c", "a:=", ":=b", "a:b:c:=d", "__ns:=/", "__ns:=/a/",
         "__ns:=r2", "__node:=1x", "__foo:=x", "n:__ns:=/x", "rostopic://a:=b",
         "n:rostopic://a:=b", "rosservice://a:=b", "a~:=b", "x-y:=b", "a:=b c", "a/*:=b",
         "/odom:=/robot1/odom", "__name:=arm"]


@pytest.fixture(scope="module")
def rcl():
    """rcl's answers (tests/ros/rcl_names.py on the Kilted rclpy) for every case above."""
    import json
    import subprocess
    from tests.support.ros_procs import HERE, ROS_PYTHON, require_ros, ros_env
    require_ros()
    cases = [{"node": n, "ns": ns, "rules": r, "names": CLIENT_NAMES} for n, ns, r in RESOLVE_CASES]
    cases += [{"rule": r} for r in RULES]
    p = subprocess.run([ROS_PYTHON, HERE + "/rcl_names.py"], input=json.dumps(cases),
                       capture_output=True, text=True, timeout=60, env=ros_env())
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    return out[:len(RESOLVE_CASES)], out[len(RESOLVE_CASES):]


@pytest.mark.parametrize("i", range(len(RESOLVE_CASES)))
def test_names_resolve_as_rcl_does(rcl, i):
    """Every client name, under every set-up, resolves to what rclpy's own
    ``Node.resolve_topic_name`` gives (None: rcl refuses it, invalid_topic here)."""
    node, ns, rules = RESOLVE_CASES[i]
    want = rcl[0][i]
    names = Names(node, ns, rules)
    assert names.fqn == want["fqn"]
    got = {}
    for name in CLIENT_NAMES:
        try:
            got[name] = names.resolve(name)
        except RosError as e:
            assert e.code == "invalid_topic" and e.message
            got[name] = None
    assert got == want["names"]


def test_remap_rules_rcl_accepts(rcl):
    def ok(rule):
        try:
            parse_remap(rule)
            return True
        except ValueError:
            return False
    assert {r: ok(r) for r in RULES} == {r: w["ok"] for r, w in zip(RULES, rcl[1])}


def test_relative_names_under_the_namespace():
    """The rules a ROS user expects, spelled out (and checked against rcl above)."""
    n = Names("ros_side", "/robot1", ["/odom:=/robot1/odom"])
    assert n.resolve("/odom") == "/robot1/odom"        # absolute, remapped
    assert n.resolve("/tf") == "/tf"                   # absolute stays
    assert n.resolve("scan") == "/robot1/scan"         # relative: under the namespace
    assert n.resolve("~/status") == "/robot1/ros_side/status"   # private: under the node
    assert Names().resolve("chatter") == "/chatter"    # no namespace: under /
    with pytest.raises(RosError) as ei:
        Names().resolve("a/1b")
    assert ei.value.code == "invalid_topic" and "'a/1b' (resolved to '/a/1b')" in ei.value.message


def test_names_refuse_what_rcl_refuses():
    for node, ns in (("a-b", "/"), ("1a", "/"), ("ok", "/a/"), ("ok", "/1a")):
        with pytest.raises(ValueError):
            Names(node, ns)
    assert Names("ok", "robot1").namespace == "/robot1"   # rcl_node_init puts it under /

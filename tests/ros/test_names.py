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

import numpy as np
import pytest

from ros_side.dds_types import TypeRegistry, ros2_distros
from ros_side.errors import RosError


@pytest.fixture(scope="module")
def humble():
    return TypeRegistry("humble")


@pytest.mark.parametrize("distro", ["humble", "jazzy"])
def test_every_typestore_message_builds(distro):
    reg = TypeRegistry(distro)
    for name in reg.store.fielddefs:
        cls = reg.idl_type(name)
        pkg, _, t = name.split("/")
        assert cls.__idl__.idl_transformed_typename == "%s::msg::dds_::%s_" % (pkg, t)


def test_cached_once(humble):
    assert humble.idl_type("std_msgs/msg/Header") is humble.idl_type("std_msgs/Header")
    # a nested type is the same class as the top-level one
    img = humble.idl_type("sensor_msgs/msg/Image")
    assert img.__annotations__["header"] is humble.idl_type("std_msgs/msg/Header")


def test_empty_message_has_placeholder(humble):
    cls = humble.idl_type("std_msgs/msg/Empty")
    assert list(cls.__annotations__) == ["structure_needs_at_least_one_member"]
    raw = humble.store.serialize_cdr(humble.store.types["std_msgs/msg/Empty"](0),
                                     "std_msgs/msg/Empty")
    assert cls.deserialize(bytes(raw)).structure_needs_at_least_one_member == 0


@pytest.mark.parametrize("t", ["std_msgs/msg/Nope", "nopkg/msg/Thing", "std_msgs", "x/y/z/w"])
def test_unknown(humble, t):
    with pytest.raises(RosError) as ei:
        humble.idl_type(t)
    assert ei.value.code == "unknown_type"


def _image(store, n):
    T = store.types
    return T["sensor_msgs/msg/Image"](
        header=T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=5, nanosec=7),
                                        frame_id="camera"),
        height=1, width=n, encoding="mono8", is_bigendian=0, step=n,
        data=(np.arange(n) % 251).astype(np.uint8))


def test_layout_matches_rosbags(humble):
    """Our IDL type decodes and re-encodes rosbags' CDR byte for byte (same layout as ROS)."""
    store = humble.store
    T = store.types
    samples = {
        "sensor_msgs/msg/Image": _image(store, 1001),
        "sensor_msgs/msg/CameraInfo": T["sensor_msgs/msg/CameraInfo"](
            header=T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=1, nanosec=2),
                                            frame_id="c"),
            height=480, width=640, distortion_model="plumb_bob",
            d=np.array([0.1, 0.2, 0.0, 0.0, 0.3]), k=np.arange(9, dtype=np.float64),
            r=np.eye(3).ravel(), p=np.arange(12, dtype=np.float64), binning_x=0, binning_y=0,
            roi=T["sensor_msgs/msg/RegionOfInterest"](x_offset=1, y_offset=2, height=3, width=4,
                                                     do_rectify=True)),
        "std_msgs/msg/String": T["std_msgs/msg/String"](data="héllo"),
    }
    for name, msg in samples.items():
        raw = bytes(store.serialize_cdr(msg, name))
        obj = humble.idl_type(name).deserialize(raw)
        again = obj.serialize()
        assert again[:len(raw)] == raw and set(again[len(raw):]) <= {0}


def test_user_msg_path(tmp_path):
    (tmp_path / "my_pkg" / "msg").mkdir(parents=True)
    (tmp_path / "my_pkg" / "msg" / "Inner.msg").write_text("uint8 K=3\nstring<=8 tag\nint32[<=4] v\n")
    (tmp_path / "my_pkg" / "msg" / "Outer.msg").write_text(
        "std_msgs/Header header\nmy_pkg/Inner[2] pair\nInner[] many\nfloat32[3] xyz\n")
    (tmp_path / "my_pkg" / "msg" / "Broken.msg").write_text("int32[ x\n")
    (tmp_path / "my_pkg" / "msg" / "Wide.msg").write_text("wstring w\n")
    reg = TypeRegistry("humble", [str(tmp_path)])
    cls = reg.idl_type("my_pkg/msg/Outer")
    assert cls.__idl__.idl_transformed_typename == "my_pkg::msg::dds_::Outer_"
    T = reg.store.types
    inner = T["my_pkg/msg/Inner"]
    msg = T["my_pkg/msg/Outer"](
        header=T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=1, nanosec=2),
                                        frame_id="f"),
        pair=[inner(tag="a", v=np.array([1], dtype=np.int32)),
              inner(tag="bb", v=np.array([], dtype=np.int32))],
        many=[inner(tag="ccc", v=np.array([1, 2, 3], dtype=np.int32))],
        xyz=np.array([1, 2, 3], dtype=np.float32))
    raw = bytes(reg.store.serialize_cdr(msg, "my_pkg/msg/Outer"))
    obj = cls.deserialize(raw)
    assert [p.tag for p in obj.pair] == ["a", "bb"] and list(obj.many[0].v) == [1, 2, 3]
    with pytest.raises(RosError):
        reg.idl_type("my_pkg/msg/Wide")
    assert any(p.startswith("my_pkg/msg/Broken") for p in reg.problems)
    (tmp_path / "my_pkg" / "msg" / "Dangling.msg").write_text("Missing thing\n")
    with pytest.raises(RosError) as ei:      # parses, but refers to a type nobody defines
        TypeRegistry("humble", [str(tmp_path)]).idl_type("my_pkg/msg/Dangling")
    assert ei.value.code == "unknown_type"


def test_user_msg_path_cannot_redefine(tmp_path):
    (tmp_path / "std_msgs" / "msg").mkdir(parents=True)
    (tmp_path / "std_msgs" / "msg" / "String.msg").write_text("int64 data\n")
    (tmp_path / "std_msgs" / "msg" / "Bool.msg").write_text("bool data\n")  # identical: fine
    reg = TypeRegistry("humble", [str(tmp_path)])
    assert reg.problems == ["std_msgs/msg/String: differs from the humble definition; ignored"]
    assert reg.store.fielddefs["std_msgs/msg/String"][1][0][1][1] == ("string", 0)


def test_type_hash():
    assert TypeRegistry("humble").type_hash("std_msgs/msg/String") is None
    jazzy = TypeRegistry("jazzy")
    # values printed by `ros2 topic info -v` on Jazzy
    assert jazzy.type_hash("std_msgs/msg/String") == (
        "RIHS01_df668c740482bbd48fb39d76a70dfd4bd59db1288021743503259e948f6b1a18")
    assert jazzy.type_hash("geometry_msgs/msg/Twist") == (
        "RIHS01_9c45bf16fe0983d80e3cfe750d6835843d265a9a6c46bd2e609fcddde6fb8d2a")


def test_distros():
    assert {"humble", "jazzy"} <= set(ros2_distros())
    with pytest.raises(ValueError):
        TypeRegistry("nosuchdistro")

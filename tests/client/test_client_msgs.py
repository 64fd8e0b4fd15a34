"""Message helpers (dict <-> rosbags dataclass), bench payload, hz statistics, server parsing."""
import numpy as np
import pytest

from ubrb_client import bench as B
from ubrb_client import msgs as M
from ubrb_client.cli import hz_stats
from ubrb_client.client import parse_server
from ubrb_client.protocol import QoS


@pytest.fixture(scope="module")
def store():
    return M.get_store("humble")


def test_from_dict_nested_arrays_defaults(store):
    m = M.from_dict(store, "sensor_msgs/Imu", {"header": {"frame_id": "imu"},
                                               "orientation_covariance": [1] * 9})
    assert m.header.frame_id == "imu" and m.header.stamp.sec == 0
    assert m.orientation.w == 1.0                       # .msg default kept
    assert m.orientation_covariance.dtype == np.float64 and m.orientation_covariance[0] == 1
    assert list(m.angular_velocity_covariance) == [0.0] * 9
    raw = M.encode(store, m)
    assert raw[:4] == b"\x00\x01\x00\x00"
    back = M.to_dict(M.decode(store, raw, "sensor_msgs/msg/Imu"))
    assert back["header"]["frame_id"] == "imu" and back["orientation_covariance"][0] == 1.0
    tf = M.from_dict(store, "tf2_msgs/msg/TFMessage", {"transforms": [{"child_frame_id": "a"}, {}]})
    assert [t.child_frame_id for t in tf.transforms] == ["a", ""]
    arr = M.from_dict(store, "std_msgs/msg/UInt8MultiArray", {"data": [1, 2, 3]})
    assert arr.data.dtype == np.uint8


def test_from_dict_errors(store):
    with pytest.raises(KeyError):
        M.from_dict(store, "std_msgs/msg/String", {"nope": 1})
    with pytest.raises(KeyError):
        M.from_dict(store, "nope_msgs/msg/X", {})
    with pytest.raises(TypeError):
        M.from_dict(store, "std_msgs/msg/Int32", {"data": "x"})
    with pytest.raises(ValueError):
        M.from_dict(store, "sensor_msgs/msg/Imu", {"orientation_covariance": [1, 2]})


def test_bench_payload_is_a_valid_uint8multiarray(store):
    raw = B.make_payload(42, 100, t_ns=123)
    m = M.decode(store, raw, B.BENCH_TYPE)
    assert len(m.data) == 100 and m.layout.dim == []
    assert B.parse_payload(raw) == (42, 123)
    assert B.percentile([1, 2, 3, 4], 0.5) == 2.5


def test_hz_stats():
    rate, mn, _mx, sd, win = hz_stats([0.0, 0.1, 0.2, 0.3])
    assert rate == pytest.approx(10.0) and mn == pytest.approx(0.1) and sd < 1e-9 and win == 3
    assert hz_stats([1.0]) is None


def test_parse_server_and_qos():
    assert parse_server("10.0.0.2:9000") == ("10.0.0.2", 9000)
    assert parse_server("robot") == ("robot", 8268)
    assert parse_server("[::1]:1") == ("::1", 1)
    assert QoS.coerce(None).to_json() == {"reliability": "reliable", "durability": "volatile", "depth": 10}
    assert QoS.coerce("sensor_data").reliability == "best_effort"
    assert QoS.coerce({"reliability": "best_effort", "depth": 1}).depth == 1
    with pytest.raises(ValueError):
        QoS("fast")

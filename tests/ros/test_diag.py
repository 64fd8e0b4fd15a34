from rosbags.typesys import Stores, get_typestore

from ros_side import diag


def test_encoding_equals_rosbags():
    store = get_typestore(Stores.ROS2_HUMBLE)
    T = store.types
    statuses = [(0, "ros_side: companion", "ok", "ubrb", [("a", "1"), ("bb", "22")]),
                (1, "ros_side: gateway", "warn", "x", []),
                (2, "n", "", "", [("k", "é")])]
    raw = diag.encode_diagnostic_array(12, 345, statuses, frame_id="f")
    msg = T["diagnostic_msgs/msg/DiagnosticArray"](
        header=T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=12, nanosec=345),
                                        frame_id="f"),
        status=[T["diagnostic_msgs/msg/DiagnosticStatus"](
            level=lv, name=n, message=m, hardware_id=h,
            values=[T["diagnostic_msgs/msg/KeyValue"](key=k, value=v) for k, v in vals])
            for lv, n, m, h, vals in statuses])
    assert raw == bytes(store.serialize_cdr(msg, diag.TYPE))
    assert diag.encode_diagnostic_array(0, 0, []) == bytes(store.serialize_cdr(
        T["diagnostic_msgs/msg/DiagnosticArray"](
            header=T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=0, nanosec=0),
                                            frame_id=""), status=[]), diag.TYPE))

# QoS presets of UBRB ADVERTISE/SUBSCRIBE requests (spec: "qos").
# MicroPython-compatible: imported by tests/core under real MicroPython too.

QOS_R = {"reliability": "reliable", "durability": "volatile", "depth": 10}
QOS_BE = {"reliability": "best_effort", "durability": "volatile", "depth": 1}
QOS_LATCH = {"reliability": "reliable", "durability": "transient_local", "depth": 1}

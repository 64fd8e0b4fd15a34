"""A simulated robot presented the way the Unreal uBotROS plugin presents one
(``python -m ubrb_client sim``).

Publishes /clock, /tf (odom->base_link), /tf_static (base_link->laser, base_link->imu_link),
/odom, /imu and /scan; subscribes /cmd_vel (geometry_msgs/msg/Twist), integrates it into the
pose (unicycle model, body frame) and stops after ``cmd_timeout`` (0.5 s) without a command,
like uBot ROS Velocity Command. The scan sees a square room (walls at +-``room``/2) with a
round pillar, so motion is visible in RViz. Messages are encoded lazily: nothing is built for a
topic whose subscriber count the bridge reported as 0.

Time: stamps and /clock carry the same time, wall-clock at start-up advanced by a monotonic
clock, so the data works with and without use_sim_time.
"""
from __future__ import annotations

import math
import threading
import time

import numpy as np

from . import msgs as M

# (topic, type, qos, rate Hz)
TOPICS = {
    "clock": ("/clock", "rosgraph_msgs/msg/Clock", "clock", 100),
    "tf": ("/tf", "tf2_msgs/msg/TFMessage", {"reliability": "reliable", "durability": "volatile", "depth": 100}, 50),
    "odom": ("/odom", "nav_msgs/msg/Odometry", "reliable", 50),
    "imu": ("/imu", "sensor_msgs/msg/Imu", "sensor_data", 100),
    "scan": ("/scan", "sensor_msgs/msg/LaserScan", "sensor_data", 10),
}
TF_STATIC = ("/tf_static", "tf2_msgs/msg/TFMessage", "latched")
CMD_VEL = ("/cmd_vel", "geometry_msgs/msg/Twist", "reliable")
TICK_HZ = 100


def _quat_yaw(yaw: float) -> dict:
    return {"x": 0.0, "y": 0.0, "z": math.sin(yaw / 2), "w": math.cos(yaw / 2)}


class SimRobot:
    def __init__(self, client, *, cmd_timeout: float = 0.5, max_linear: float = 2.0,
                 max_angular: float = 3.0, room: float = 10.0, beams: int = 360,
                 namespace: str = "", out=print):
        self.c = client
        self.store = client.store
        self.cmd_timeout = cmd_timeout
        self.max_linear = max_linear
        self.max_angular = max_angular
        self.room = room
        self.beams = beams
        self.out = out
        ns = namespace.rstrip("/")
        self.lock = threading.Lock()
        self.x = self.y = self.yaw = 0.0
        self.v = self.vy = self.w = 0.0
        self.cmd = (0.0, 0.0, 0.0)
        self.last_cmd: float | None = None
        self.cmds = 0
        self.stopped_by_timeout = 0
        self._prev_v = 0.0
        self.pubs = {k: client.advertise(ns + t, ty, q) for k, (t, ty, q, _) in TOPICS.items()}
        self.tf_static = client.advertise(ns + TF_STATIC[0], TF_STATIC[1], TF_STATIC[2])
        self.cmd_sub = client.subscribe(ns + CMD_VEL[0], CMD_VEL[1], self._on_cmd, CMD_VEL[2])
        self.angles = np.linspace(-math.pi, math.pi, beams, endpoint=False)
        self._t0_wall_ns = time.time_ns()
        self._t0_mono = time.monotonic()

    # -------------------------------------------------------------------------- commands
    def _on_cmd(self, msg) -> None:
        lx = max(-self.max_linear, min(self.max_linear, float(msg.linear.x)))
        ly = max(-self.max_linear, min(self.max_linear, float(msg.linear.y)))
        az = max(-self.max_angular, min(self.max_angular, float(msg.angular.z)))
        with self.lock:
            self.cmd = (lx, ly, az)
            self.last_cmd = time.monotonic()
            self.cmds += 1

    def step(self, dt: float, now: float) -> None:
        with self.lock:
            if self.last_cmd is not None and now - self.last_cmd > self.cmd_timeout:
                self.cmd = (0.0, 0.0, 0.0)       # Stop Motion, once
                self.last_cmd = None
                self.stopped_by_timeout += 1
            self._prev_v = self.v
            self.v, self.vy, self.w = self.cmd
            c, s = math.cos(self.yaw), math.sin(self.yaw)
            self.x += (self.v * c - self.vy * s) * dt
            self.y += (self.v * s + self.vy * c) * dt
            self.yaw = math.atan2(math.sin(self.yaw + self.w * dt), math.cos(self.yaw + self.w * dt))

    # -------------------------------------------------------------------------- messages
    def stamp(self, mono: float | None = None) -> dict:
        mono = time.monotonic() if mono is None else mono
        ns = self._t0_wall_ns + int((mono - self._t0_mono) * 1e9)
        return {"sec": ns // 1_000_000_000, "nanosec": ns % 1_000_000_000}

    def _pose(self):
        with self.lock:
            return self.x, self.y, self.yaw, self.v, self.vy, self.w, self._prev_v

    def msg_clock(self, st):
        return M.from_dict(self.store, "rosgraph_msgs/msg/Clock", {"clock": st})

    def msg_tf(self, st):
        x, y, yaw, *_ = self._pose()
        return M.from_dict(self.store, "tf2_msgs/msg/TFMessage", {"transforms": [{
            "header": {"stamp": st, "frame_id": "odom"}, "child_frame_id": "base_link",
            "transform": {"translation": {"x": x, "y": y}, "rotation": _quat_yaw(yaw)}}]})

    def msg_tf_static(self, st):
        return M.from_dict(self.store, "tf2_msgs/msg/TFMessage", {"transforms": [
            {"header": {"stamp": st, "frame_id": "base_link"}, "child_frame_id": "laser",
             "transform": {"translation": {"x": 0.1, "z": 0.2}}},
            {"header": {"stamp": st, "frame_id": "base_link"}, "child_frame_id": "imu_link",
             "transform": {"translation": {"z": 0.1}}}]})

    def msg_odom(self, st):
        x, y, yaw, v, vy, w, _ = self._pose()
        cov = [0.0] * 36
        for i in range(6):
            cov[i * 7] = 1e-3
        return M.from_dict(self.store, "nav_msgs/msg/Odometry", {
            "header": {"stamp": st, "frame_id": "odom"}, "child_frame_id": "base_link",
            "pose": {"pose": {"position": {"x": x, "y": y}, "orientation": _quat_yaw(yaw)},
                     "covariance": cov},
            "twist": {"twist": {"linear": {"x": v, "y": vy}, "angular": {"z": w}},
                      "covariance": cov}})

    def msg_imu(self, st):
        _x, _y, yaw, v, _vy, w, prev_v = self._pose()
        cov = [1e-4, 0, 0, 0, 1e-4, 0, 0, 0, 1e-4]
        return M.from_dict(self.store, "sensor_msgs/msg/Imu", {
            "header": {"stamp": st, "frame_id": "imu_link"},
            "orientation": _quat_yaw(yaw), "orientation_covariance": cov,
            "angular_velocity": {"z": w}, "angular_velocity_covariance": cov,
            "linear_acceleration": {"x": (v - prev_v) * TICK_HZ, "y": v * w, "z": 9.80665},
            "linear_acceleration_covariance": cov})

    def ranges(self) -> np.ndarray:
        """Ray cast from the laser (0.1 m ahead of base_link) against the room and a pillar."""
        x, y, yaw, *_ = self._pose()
        lx, ly = x + 0.1 * math.cos(yaw), y + 0.1 * math.sin(yaw)
        a = self.angles + yaw
        dx, dy = np.cos(a), np.sin(a)
        h = self.room / 2
        with np.errstate(divide="ignore", invalid="ignore"):
            tx = np.where(dx > 0, (h - lx) / dx, np.where(dx < 0, (-h - lx) / dx, np.inf))
            ty = np.where(dy > 0, (h - ly) / dy, np.where(dy < 0, (-h - ly) / dy, np.inf))
        r = np.minimum(tx, ty)
        # pillar of radius 0.5 m at (2, 1)
        px, py, pr = 2.0 - lx, 1.0 - ly, 0.5
        b = dx * px + dy * py
        disc = b * b - (px * px + py * py - pr * pr)
        hit = (disc >= 0) & (b > 0)
        tp = np.where(hit, b - np.sqrt(np.maximum(disc, 0)), np.inf)
        r = np.minimum(r, np.where(tp > 0, tp, np.inf))
        return np.clip(r, 0.0, 30.0).astype(np.float32)

    def msg_scan(self, st):
        inc = 2 * math.pi / self.beams
        ScanT = self.store.types["sensor_msgs/msg/LaserScan"]
        hdr = M.from_dict(self.store, "std_msgs/msg/Header", {"stamp": st, "frame_id": "laser"})
        return ScanT(header=hdr, angle_min=-math.pi, angle_max=math.pi - inc, angle_increment=inc,
                     time_increment=0.1 / self.beams, scan_time=0.1, range_min=0.05,
                     range_max=30.0, ranges=self.ranges(),
                     intensities=np.full(self.beams, 100.0, dtype=np.float32))

    # ------------------------------------------------------------------------------ run
    def status(self) -> str:
        x, y, yaw, v, _vy, w, _ = self._pose()
        with self.lock:
            cmd = "cmd" if self.last_cmd is not None else "idle"
        sc = self.pubs["scan"].subscriber_count
        return (f"[sim] x={x:+7.2f} y={y:+7.2f} yaw={math.degrees(yaw):+7.1f}deg "
                f"v={v:+5.2f} m/s w={w:+5.2f} rad/s {cmd:4s} cmds={self.cmds} "
                f"{'connected' if self.c.connected else 'DISCONNECTED'}"
                f" scan_subs={'?' if sc is None else sc}")

    def run(self, duration: float | None = None, stop: threading.Event | None = None) -> None:
        stop = stop or threading.Event()
        self.tf_static.publish_msg(lambda: self.msg_tf_static(self.stamp()))
        period = 1.0 / TICK_HZ
        t0 = time.monotonic()
        next_t = t0
        tick = 0
        prev = t0
        while not stop.is_set():
            now = time.monotonic()
            if duration is not None and now - t0 >= duration:
                break
            self.step(now - prev, now)
            prev = now
            st = self.stamp(now)
            # Lazy: each message is only built if its topic has (or may have) subscribers.
            self.pubs["clock"].publish_msg(lambda st=st: self.msg_clock(st))
            self.pubs["imu"].publish_msg(lambda st=st: self.msg_imu(st))
            if tick % 2 == 0:
                self.pubs["tf"].publish_msg(lambda st=st: self.msg_tf(st))
                self.pubs["odom"].publish_msg(lambda st=st: self.msg_odom(st))
            if tick % 10 == 0:
                self.pubs["scan"].publish_msg(lambda st=st: self.msg_scan(st))
            if tick % TICK_HZ == 0 and tick:
                self.out(self.status())
            tick += 1
            next_t += period
            delay = next_t - time.monotonic()
            if delay > 0:
                stop.wait(delay)
            elif delay < -1.0:
                next_t = time.monotonic()   # fell far behind: do not burst

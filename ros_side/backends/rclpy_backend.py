"""Backend ``rclpy``: a thin layer over a ROS 2 installation's rclpy (Foxy and later).

Needs nothing beyond a minimal ROS 2 runtime (rclpy and the message packages; not
rosidl_runtime_py, which e.g. the PyPI Kilted wheels do not ship). Only documented rclpy API is
used (see shared/design/ROS-NOTES.md):

* message classes: ``importlib.import_module('pkg.msg')`` and the attribute ``Type``, as
  rosidl_runtime_py's ``get_message`` does; no such module or attribute, or an attribute that is
  not a generated message class (no ``__import_type_support__``), -> ``unknown_type``;
* topic names: ``rclpy.validate_full_topic_name.validate_full_topic_name`` (raises
  ``InvalidTopicNameException``) -> ``invalid_topic``; the companion uses it instead of its own
  check through ``check_topic``;
* ``Node.create_publisher(cls, topic, QoSProfile)`` and ``Publisher.publish(bytes)`` (serialized
  CDR incl. the 4-byte header; rclpy wants ``bytes``, not bytearray/memoryview);
* ``Node.create_subscription(cls, topic, cb, QoSProfile, raw=True)``: ``cb(bytes)``;
* ``Publisher.wait_for_all_acked(Duration)`` (timeout 0: asks without waiting): a released
  publisher is destroyed once its subscriptions acknowledged everything (Companion, DRAIN_MS);
* ``Publisher.get_subscription_count()`` counts every matched subscription, including this node's
  own ones on that topic: they are subtracted (a own subscription with incompatible QoS would not
  be matched, so the result is clamped at 0);
* entities are created and destroyed on the executor thread (a guard condition's callback runs the
  queued work: ``node.create_guard_condition(cb)``, ``.trigger()``); ``publish`` and
  ``get_subscription_count`` are called from the companion's thread (rcl: thread-safe per
  publisher).
"""

import importlib
import os
import queue
import re
import threading

from ..errors import RosError
from ..qos import normalize_qos, policy_name

_TIMEOUT = 10.0


def load_message_class(ros_type):
    """The generated Python class of ``pkg/msg/Type`` (already normalised by the companion), with
    its type support loaded; RosError('unknown_type') when this installation has no such
    message."""
    pkg, _, name = ros_type.split("/")
    try:
        module = importlib.import_module(pkg + ".msg")
    except ImportError as e:
        raise RosError("unknown_type", "%s: no message package %r here (%s)" % (ros_type, pkg, e))
    cls = getattr(module, name, None)
    load = getattr(cls, "__import_type_support__", None)
    if cls is None or not callable(load):
        raise RosError("unknown_type", "%s: package %r has no message %r" % (ros_type, pkg, name))
    try:
        load()
    except Exception as e:  # its C type support does not load: unusable here
        raise RosError("unknown_type", "%s: cannot load its type support: %s" % (ros_type, e))
    return cls


class _Pub:
    __slots__ = ("topic", "type", "pub", "incompatible")

    def __init__(self, topic, ros_type, pub=None):
        self.topic = topic
        self.type = ros_type
        self.pub = pub
        self.incompatible = (0, "")   # (total count, policy) from rclpy's incompatible-QoS event


class _Sub:
    __slots__ = ("topic", "type", "sub", "incompatible")

    def __init__(self, topic, ros_type, sub=None):
        self.topic = topic
        self.type = ros_type
        self.sub = sub
        self.incompatible = (0, "")


_DISTRO_LINE = re.compile(r"^\s*(?:export\s+ROS_DISTRO=|set;ROS_DISTRO;)['\"]?([A-Za-z0-9_]+)", re.M)
_WHEEL = re.compile(r"^ros[-_.]([a-z0-9]+)[-_.]rclpy$")


def _prefix_distro(prefix):
    """The distro an install prefix records: ros_environment's environment hook (what sets
    ROS_DISTRO when the prefix's setup.bash is sourced), else a /opt/ros/<distro> path."""
    hooks = os.path.join(prefix, "share", "ros_environment", "environment")
    for name in ("1.ros_distro.sh", "1.ros_distro.dsv"):
        try:
            with open(os.path.join(hooks, name), encoding="utf-8", errors="replace") as f:
                m = _DISTRO_LINE.search(f.read(4096))
        except OSError:
            continue
        if m:
            return m.group(1).lower()
    parent, name = os.path.split(os.path.normpath(prefix))
    if os.path.normpath(parent) == os.path.join(os.sep, "opt", "ros") and name:
        return name.lower()
    return None


def installed_distro(env=None, rclpy_file=None):
    """The ROS 2 distro of the rclpy this backend runs on: ``ROS_DISTRO`` when it is set (a
    sourced setup.bash sets it); else what the installation itself records - the ament index's
    ros_environment package (in the prefixes of ``AMENT_PREFIX_PATH``, then in rclpy's own
    prefix, ``<prefix>/lib/pythonX.Y/site-packages/rclpy``), a ``/opt/ros/<distro>`` prefix, or
    the PyPI wheels' distribution ``ros-<distro>-rclpy`` (.venv-ros: ROS 2 Kilted from PyPI sets
    no variable); "unknown" only when none of them says."""
    env = os.environ if env is None else env
    text = env.get("ROS_DISTRO", "").strip()
    if text:
        return text.lower()
    prefixes = [p for p in env.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    if rclpy_file:
        prefixes.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.dirname(os.path.abspath(rclpy_file)))))))
    for prefix in prefixes:
        found = _prefix_distro(prefix)
        if found:
            return found
    try:
        from importlib import metadata
        for dist in metadata.distributions():
            m = _WHEEL.match(str(dist.metadata["Name"] or "").lower())
            if m:
                return m.group(1)
    except Exception:  # metadata that does not read: nothing recorded there
        pass
    return "unknown"


def _event_callbacks():
    """rclpy's (PublisherEventCallbacks, SubscriptionEventCallbacks): Iron+ ``event_handler``,
    Humble ``qos_event``."""
    try:
        from rclpy.event_handler import PublisherEventCallbacks, SubscriptionEventCallbacks
    except ImportError:  # Humble
        from rclpy.qos_event import (PublisherEventCallbacks,  # type: ignore[no-redef]
                                     SubscriptionEventCallbacks)
    return PublisherEventCallbacks, SubscriptionEventCallbacks


def _on_incompatible(handle):
    def record(status):  # the rmw kind's own name is "RMW_QOS_POLICY_RELIABILITY": say RELIABILITY
        handle.incompatible = (status.total_count, policy_name(status.last_policy_kind))
    return record


class RclpyBackend:
    name = "rclpy"

    def __init__(self, node_name="ros_side", domain=None, context=None, args=None,
                 node_namespace="/"):
        import rclpy
        from rclpy.duration import Duration
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
        from rclpy.validate_full_topic_name import validate_full_topic_name
        from rclpy.exceptions import InvalidTopicNameException

        self._rclpy = rclpy
        self._Duration = Duration
        self._QoSProfile = QoSProfile
        self._Reliability = ReliabilityPolicy
        self._Durability = DurabilityPolicy
        self._History = HistoryPolicy
        self._validate = validate_full_topic_name
        self._InvalidTopic = InvalidTopicNameException
        self._PubEvents, self._SubEvents = _event_callbacks()
        self.distro = installed_distro(rclpy_file=getattr(rclpy, "__file__", None))
        self._owns_init = False
        # rcl sees no command line of ours (args=[], not sys.argv) and the node ignores the
        # context's arguments: ros_side resolves and remaps every name itself (names.Names, the
        # same on both backends) and hands rclpy absolute names, which rcl would otherwise
        # remap a second time. The node's own name and namespace are what Names settled on.
        if context is None and not rclpy.ok():
            if domain is None:
                rclpy.init(args=args or [])
            else:
                rclpy.init(args=args or [], domain_id=int(domain))
            self._owns_init = True
        self.node = rclpy.create_node(node_name, namespace=node_namespace,
                                      use_global_arguments=False)
        self._executor = SingleThreadedExecutor()
        self._executor.add_node(self.node)
        self._work = queue.Queue()
        self._guard = self.node.create_guard_condition(self._run_work)
        self._own_subs = {}  # topic -> number of own subscriptions
        self._lock = threading.Lock()
        self._classes = {}
        self._thread = threading.Thread(target=self._spin, name="ros_side-rclpy", daemon=True)
        self._thread.start()

    def declare_parameters(self, values):
        """Declare the effective command-line settings as this node's ROS parameters, so that
        `ros2 param get /ros_side link` shows what the companion runs with."""
        def declare():
            for name, value in sorted(values.items()):
                if isinstance(value, (bool, int, float, str)) and not self.node.has_parameter(name):
                    self.node.declare_parameter(name, value)
        self._call(declare)

    # -- executor thread ----------------------------------------------------------------------
    def _spin(self):
        try:
            self._executor.spin()
        except Exception:  # pragma: no cover - shutdown races
            pass

    def _run_work(self):
        while True:
            try:
                fn, box, done = self._work.get_nowait()
            except queue.Empty:
                return
            try:
                box.append((True, fn()))
            except BaseException as e:  # handed back to the caller
                box.append((False, e))
            done.set()

    def _call(self, fn):
        """Run ``fn`` on the executor thread and return its result (or raise its exception)."""
        if threading.current_thread() is self._thread:
            return fn()
        box, done = [], threading.Event()
        self._work.put((fn, box, done))
        self._guard.trigger()
        if not done.wait(_TIMEOUT):
            raise RuntimeError("rclpy executor did not run the request in %.0f s" % _TIMEOUT)
        ok, value = box[0]
        if ok:
            return value
        raise value

    # -- helpers ------------------------------------------------------------------------------
    def check_topic(self, name):
        try:
            self._validate(name)
        except self._InvalidTopic as e:
            raise RosError("invalid_topic", str(e))
        return name

    def _msg_class(self, ros_type):
        cls = self._classes.get(ros_type)
        if cls is None:
            cls = load_message_class(ros_type)
            self._classes[ros_type] = cls
        return cls

    def _profile(self, qos):
        try:
            reliable, transient_local, depth = normalize_qos(qos)
        except ValueError as e:
            raise RosError("qos_conflict", str(e))
        return self._QoSProfile(
            history=self._History.KEEP_LAST, depth=depth,
            reliability=self._Reliability.RELIABLE if reliable else self._Reliability.BEST_EFFORT,
            durability=(self._Durability.TRANSIENT_LOCAL if transient_local
                        else self._Durability.VOLATILE))

    # -- Backend interface --------------------------------------------------------------------
    def create_publisher(self, topic, ros_type, qos):
        cls = self._msg_class(ros_type)
        profile = self._profile(qos)
        handle = _Pub(topic, ros_type)
        events = self._PubEvents(incompatible_qos=_on_incompatible(handle))
        handle.pub = self._call(lambda: self.node.create_publisher(cls, topic, profile,
                                                                   event_callbacks=events))
        return handle

    def destroy_publisher(self, handle):
        pub, handle.pub = handle.pub, None
        if pub is not None:
            self._call(lambda: self.node.destroy_publisher(pub))

    def publish(self, handle, data):
        pub = handle.pub
        if pub is not None:
            pub.publish(data if type(data) is bytes else bytes(data))

    def acked(self, handle, timeout_s=0.0):
        """Has every matched reliable subscription acknowledged all this publisher published
        (``Publisher.wait_for_all_acked``, Galactic and later; waits up to ``timeout_s``, 0:
        just asks)? True on an rclpy without it: nothing to wait for."""
        pub = handle.pub
        wait = getattr(pub, "wait_for_all_acked", None)
        if wait is None:
            return True
        return wait(self._Duration(nanoseconds=int(timeout_s * 1e9)))

    def subscription_count(self, handle):
        pub = handle.pub
        if pub is None:
            return 0
        with self._lock:
            own = self._own_subs.get(handle.topic, 0)
        return max(0, pub.get_subscription_count() - own)

    def create_subscription(self, topic, ros_type, qos, callback):
        cls = self._msg_class(ros_type)
        profile = self._profile(qos)

        def on_msg(data, *info):  # Humble passes one argument; Iron+ may add message info
            callback(data)

        handle = _Sub(topic, ros_type)
        events = self._SubEvents(incompatible_qos=_on_incompatible(handle))
        handle.sub = self._call(lambda: self.node.create_subscription(
            cls, topic, on_msg, profile, raw=True, event_callbacks=events))
        with self._lock:
            self._own_subs[topic] = self._own_subs.get(topic, 0) + 1
        return handle

    def incompatible_qos(self, handle):
        """(total count, policy name) from rclpy's incompatible-QoS event of this entity."""
        return handle.incompatible

    def destroy_subscription(self, handle):
        sub, handle.sub = handle.sub, None
        if sub is None:
            return
        with self._lock:
            n = self._own_subs.get(handle.topic, 0) - 1
            if n > 0:
                self._own_subs[handle.topic] = n
            else:
                self._own_subs.pop(handle.topic, None)
        self._call(lambda: self.node.destroy_subscription(sub))

    def close(self):
        try:
            self._executor.shutdown()
        except Exception:  # pragma: no cover
            pass
        self._thread.join(2.0)
        try:
            self.node.destroy_node()
        finally:
            if self._owns_init:
                try:
                    self._rclpy.shutdown()
                except Exception:  # pragma: no cover
                    pass

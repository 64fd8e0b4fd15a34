"""ROS 2 message types as cyclonedds IDL types, built at run time from the rosbags typestore.

``TypeRegistry(distro, msg_paths)`` holds one rosbags typestore (``--ros-distro``, default humble)
plus the user's own ``.msg`` packages (``--msg-path DIR``: ``DIR/<pkg>/msg/*.msg``, which is also the
layout of a colcon ``install/<pkg>/share`` tree). ``registry.idl_type('pkg/msg/T')`` returns a
cyclonedds ``IdlStruct`` class whose DDS type name is ``pkg::msg::dds_::T_`` and whose members
follow the .msg field by field, so its XCDR1 (classic CDR) layout is the one ROS 2 puts on the
wire. Built once per type and cached (nested types too).

Mapping (rosbags field descriptor -> cyclonedds.idl.types):
  bool -> bool; byte -> byte (octet); char -> uint8 (ROS 2 ``char`` is an unsigned 8-bit);
  int8..uint64, float32/64 -> same; string -> str; string<=N -> bounded_str[N];
  T[N] -> array[T, N]; T[] -> sequence[T]; T[<=N] -> sequence[T, N]; pkg/msg/T -> nested struct.
  Constants carry no data and are ignored. An empty message has rosbags'
  ``structure_needs_at_least_one_member: uint8`` (the member rosidl adds), kept as is.
  ``wstring`` is not supported by cyclonedds-python (no wide strings): ``unknown_type``.
Only the struct members matter to DDS matching in ROS 2 (topic + type name; no XTypes type
information is used by rmw_cyclonedds/rmw_fastrtps), but the types are exact anyway so that a
typed cyclonedds reader can decode the raw bytes (the tests rely on it).
"""

import os
import threading

from cyclonedds.idl import make_idl_struct
from cyclonedds.idl import types as T

from .errors import RosError
from .names import dds_type_name, normalize_type

from rosbags.interfaces import Nodetype
from rosbags.typesys import Stores, get_typestore, get_types_from_msg

_BASE = {
    "bool": bool,
    "byte": T.byte,
    "char": T.uint8,
    "int8": T.int8,
    "uint8": T.uint8,
    "int16": T.int16,
    "uint16": T.uint16,
    "int32": T.int32,
    "uint32": T.uint32,
    "int64": T.int64,
    "uint64": T.uint64,
    "float32": T.float32,
    "float64": T.float64,
}

# Distros without type hashes in USER_DATA (REP-2011 type hashes arrived with Iron).
_PRE_IRON = ("dashing", "eloquent", "foxy", "galactic", "humble")


def ros2_distros():
    """Distro names the installed rosbags knows (``humble``, ``jazzy``, ...)."""
    return [s.value[len("ros2_"):] for s in Stores if s.value.startswith("ros2_")]


def get_store(distro):
    key = str(distro).strip().lower()
    for s in Stores:
        if s.value == "ros2_" + key:
            return get_typestore(s)
    raise ValueError("unknown ROS 2 distro %r (rosbags knows: %s)"
                     % (distro, ", ".join(ros2_distros())))


def load_msg_dir(directory):
    """Parse every ``<pkg>/msg/*.msg`` under ``directory`` -> rosbags typesdict (and problems)."""
    types = {}
    problems = []
    try:
        pkgs = sorted(os.listdir(directory))
    except OSError as e:  # --msg-path checks it is a readable directory; it may still go
        return types, ["%s: %s" % (directory, e.strerror or e)]
    for pkg in pkgs:
        mdir = os.path.join(directory, pkg, "msg")
        if not os.path.isdir(mdir):
            continue
        try:
            files = sorted(os.listdir(mdir))
        except OSError as e:
            problems.append("%s: %s" % (mdir, e.strerror or e))
            continue
        for fn in files:
            if not fn.endswith(".msg"):
                continue
            name = "%s/msg/%s" % (pkg, fn[:-4])
            try:
                with open(os.path.join(mdir, fn), encoding="utf-8") as f:
                    types.update(get_types_from_msg(f.read(), name))
            except Exception as e:  # malformed .msg: report, keep the rest
                problems.append("%s: %s" % (name, e))
    return types, problems


def _same_def(a, b):
    try:
        return a == b or (list(a[1]) == list(b[1]))
    except Exception:  # pragma: no cover
        return False


class TypeRegistry:
    def __init__(self, distro="humble", msg_paths=()):
        self.distro = str(distro).strip().lower()
        self.store = get_store(self.distro)
        self.problems = []
        self.msg_paths = list(msg_paths or ())
        user = {}
        for d in msg_paths or ():
            t, p = load_msg_dir(d)
            user.update(t)
            self.problems.extend(p)
        for name in list(user):
            known = self.store.fielddefs.get(name)
            if known is not None and not _same_def(known, user[name]):
                # the distro's definition wins; a different one under the same name is a mistake
                self.problems.append("%s: differs from the %s definition; ignored" % (name, distro))
                del user[name]
        if user:
            try:
                self.store.register(user)
            except Exception as e:  # one bad type: keep whatever registers on its own
                self.problems.append("registering --msg-path types: %s" % e)
                for _ in range(len(user)):
                    progress = False
                    for name in list(user):
                        try:
                            self.store.register({name: user[name]})
                        except Exception:
                            continue
                        del user[name]
                        progress = True
                    if not progress:
                        break
                for name in user:
                    self.problems.append("%s: not registered" % name)
        self._lock = threading.RLock()
        self._cache = {}
        self._building = set()
        self._hashes = {}

    def known(self, ros_type):
        return ros_type in self.store.fielddefs

    def idl_type(self, type_string):
        """The cached IdlStruct class for ``type_string``; RosError('unknown_type') otherwise."""
        ros_type = normalize_type(type_string)
        with self._lock:
            cls = self._cache.get(ros_type)
            if cls is None:
                cls = self._build(ros_type)
            return cls

    def type_hash(self, type_string):
        """``RIHS01_<hex>`` for Iron and later (None for Humble and older, or if not computable).

        rosbags' ``hash_rihs01`` agrees with ROS for e.g. std_msgs/msg/String
        (RIHS01_df668c74...1a18) and geometry_msgs/msg/Twist (RIHS01_9c45bf16...8d2a), the
        values ``ros2 topic info -v`` prints on Jazzy.
        """
        if self.distro in _PRE_IRON:
            return None
        ros_type = normalize_type(type_string)
        with self._lock:
            if ros_type not in self._hashes:
                try:
                    self._hashes[ros_type] = self.store.hash_rihs01(ros_type)
                except Exception:
                    self._hashes[ros_type] = None
            return self._hashes[ros_type]

    # -- building ------------------------------------------------------------------------------
    def _build(self, ros_type):
        defs = self.store.fielddefs.get(ros_type)
        if defs is None:
            raise RosError("unknown_type", "%s is not a known message type (ROS 2 %s typestore%s)"
                           % (ros_type, self.distro, " + --msg-path" if self.msg_paths else ""))
        if ros_type in self._building:
            raise RosError("unknown_type", "%s is recursive" % ros_type)
        self._building.add(ros_type)
        try:
            fields = {}
            for fname, desc in defs[1]:
                fields[fname] = self._field(ros_type, fname, desc)
            pkg, _, name = ros_type.split("/")
            pyname = "%s__msg__%s_" % (pkg, name)
            tname = dds_type_name(ros_type)
            try:
                cls = make_idl_struct(pyname, tname, fields)
            except Exception:
                # e.g. a field named like a Python keyword: no generated __init__ needed by us.
                cls = make_idl_struct(pyname, tname, fields, dataclassify=False)
            try:
                cls.__idl__.populate()
            except Exception as e:
                raise RosError("unknown_type", "%s: cannot build DDS type: %s" % (ros_type, e))
            self._cache[ros_type] = cls
            return cls
        finally:
            self._building.discard(ros_type)

    def _field(self, owner, fname, desc):
        kind, arg = desc
        if kind == Nodetype.BASE:
            tname, bound = arg
            if tname == "string":
                return T.bounded_str[bound] if bound else str
            if tname == "wstring":
                raise RosError("unknown_type", "%s.%s: wstring is not supported by the dds backend"
                               % (owner, fname))
            base = _BASE.get(tname)
            if base is None:
                raise RosError("unknown_type", "%s.%s: unsupported type %s" % (owner, fname, tname))
            return base
        if kind == Nodetype.NAME:
            if arg not in self.store.fielddefs:
                raise RosError("unknown_type", "%s.%s: unknown type %s" % (owner, fname, arg))
            cls = self._cache.get(arg)
            return cls if cls is not None else self._build(arg)
        if kind == Nodetype.ARRAY:
            sub, n = arg
            return T.array[self._field(owner, fname, sub), n]
        if kind == Nodetype.SEQUENCE:
            sub, bound = arg
            inner = self._field(owner, fname, sub)
            return T.sequence[inner, bound] if bound else T.sequence[inner]
        raise RosError("unknown_type", "%s.%s: unsupported field kind %r" % (owner, fname, kind))

"""Message packages the Kilted wheels do not ship, built for .venv-ros by the tests (a test-support
build step): ``tf2_msgs`` (``/tf`` and ``/tf_static``: ``tf2_msgs/msg/TFMessage``).

There is no PyPI wheel of tf2_msgs, so ``ensure_tf2_msgs()`` generates it from its definition
with the Kilted rosidl generators the wheels ship (rosidl_generator_c, rosidl_generator_py,
rosidl_typesupport_c, rosidl_typesupport_fastrtps_c, rosidl_typesupport_introspection_c; the
``.idl`` is written directly, since rosidl_adapter's .msg -> .idl step needs catkin_pkg, which
the wheels lack) and compiles the C libraries and Python extensions with the system's C and C++
compilers against the headers and libraries in .venv-ros, the layout ``rosidl_generate_interfaces``
produces. Only ``TFMessage`` is built (tf2_msgs' other interfaces are services and an action):
its DDS type name and type hash are those of the real package. The result lives in
``build/ros-msgs/`` (``python/`` for PYTHONPATH, ``lib/`` for LD_LIBRARY_PATH; the wheels'
bootstrapper keeps an LD_LIBRARY_PATH it is given), is built once (~20 s) and reused while its
inputs are unchanged; ``ros_procs.ros_env()`` adds both paths when it exists.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

from tests.support.procs import ROOT

VENV_ROS = os.path.join(ROOT, ".venv-ros")
OUT = os.path.join(ROOT, "build", "ros-msgs")
PYTHON_DIR = os.path.join(OUT, "python")
LIB_DIR = os.path.join(OUT, "lib")

# tf2_msgs/msg/TFMessage.msg is "geometry_msgs/TransformStamped[] transforms"; this is what
# rosidl_adapter makes of it (without the comments, which do not enter the type hash).
TFMESSAGE_IDL = """\
// generated from rosidl_adapter/resource/msg.idl.em
// with input from tf2_msgs/msg/TFMessage.msg
// generated code does not contain a copyright notice

#include "geometry_msgs/msg/TransformStamped.idl"

module tf2_msgs {
  module msg {
    struct TFMessage {
      sequence<geometry_msgs::msg::TransformStamped> transforms;
    };
  };
};
"""

_GENERATE = r"""
import pathlib, sys
from rosidl_generator_c.cli import GenerateC
from rosidl_generator_py.cli import GeneratePython
from rosidl_typesupport_c.cli import GenerateCTypesupport
from rosidl_typesupport_fastrtps_c.cli import GenerateFastRTPSCTypesupport
from rosidl_typesupport_introspection_c.cli import GenerateIntrospectionCTypesupport
src, out, share = sys.argv[1:4]
for name, cls in [("c", GenerateC), ("py", GeneratePython), ("typesupport_c", GenerateCTypesupport),
                  ("fastrtps_c", GenerateFastRTPSCTypesupport),
                  ("introspection_c", GenerateIntrospectionCTypesupport)]:
    cls(name).generate("tf2_msgs", [src + ":msg/TFMessage.idl"], [share],
                       output_path=pathlib.Path(out) / name)
"""

# Python extension modules: rclpy imports <pkg>.<pkg>_s__<typesupport> (rosidl_generator_py)
_TYPESUPPORTS = ("rosidl_typesupport_c", "rosidl_typesupport_fastrtps_c",
                 "rosidl_typesupport_introspection_c")


def _stamp() -> str:
    """What the build depends on: this file, the generators' versions, the compilers."""
    h = hashlib.sha256()
    with open(os.path.abspath(__file__), "rb") as f:
        h.update(f.read())
    site = os.path.join(VENV_ROS, "lib", "python3.11", "site-packages")
    if os.path.isdir(site):
        h.update(" ".join(sorted(d for d in os.listdir(site) if d.startswith("ros_rosidl")
                                 or d.startswith("ros_kilted_geometry_msgs"))).encode())
    return h.hexdigest()


def _run(argv: List[str], env: Optional[Dict[str, str]] = None) -> None:
    r = subprocess.run(argv, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError("tf2_msgs build step failed: %s\n%s%s"
                           % (" ".join(argv[:3]), r.stdout[-3000:], r.stderr[-3000:]))


def available() -> bool:
    """True when a build of tf2_msgs for .venv-ros is there (ensure_tf2_msgs made it)."""
    return os.path.exists(os.path.join(OUT, "stamp"))


def ensure_tf2_msgs() -> str:
    """Build ``tf2_msgs`` for .venv-ros into build/ros-msgs unless an up-to-date build is there;
    returns OUT. RuntimeError (with the compiler's output) when a step fails. Processes that ask
    at once (the workers of `make test`) take turns: one builds, the others then find it built."""
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure_tf2_msgs()


def _ensure_tf2_msgs() -> str:
    stamp = _stamp()
    stamp_file = os.path.join(OUT, "stamp")
    try:
        with open(stamp_file) as f:
            if f.read() == stamp:
                return OUT
    except OSError:
        pass
    cc = shutil.which("cc") or shutil.which("gcc")
    cxx = shutil.which("c++") or shutil.which("g++")
    if not cc or not cxx:
        raise RuntimeError("building tf2_msgs for .venv-ros needs a C and a C++ compiler "
                           "(apt-get install g++)")
    ros_python = os.path.join(VENV_ROS, "bin", "python")
    tmp = OUT + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    src = os.path.join(tmp, "src", "tf2_msgs")
    gen = os.path.join(tmp, "gen")
    os.makedirs(os.path.join(src, "msg"))
    with open(os.path.join(src, "msg", "TFMessage.idl"), "w") as f:
        f.write(TFMESSAGE_IDL)
    env = dict(os.environ, AMENT_PREFIX_PATH=VENV_ROS)
    env.pop("_ROS_WHEELS_BOOTSTRAP_COMPLETE", None)
    _run([ros_python, "-c", _GENERATE, src, gen, os.path.join(VENV_ROS, "share")], env=env)

    # headers as installed: include/tf2_msgs/msg/... from every generator
    inc = os.path.join(tmp, "include")
    for part in ("c", "fastrtps_c", "introspection_c"):
        shutil.copytree(os.path.join(gen, part, "msg"), os.path.join(inc, "tf2_msgs", "msg"),
                        dirs_exist_ok=True)
    venv_inc = os.path.join(VENV_ROS, "include")
    incs = ["-I" + inc, "-I" + venv_inc] + [
        "-I" + os.path.join(venv_inc, d) for d in sorted(os.listdir(venv_inc))]
    r = subprocess.run([ros_python, "-c", "import sysconfig, numpy; print(sysconfig.get_paths()"
                        "['include']); print(numpy.get_include())"],
                       capture_output=True, text=True, env=env, check=True)
    py_inc, np_inc = r.stdout.split()
    lib = os.path.join(tmp, "lib")
    pkg = os.path.join(tmp, "python", "tf2_msgs")
    os.makedirs(lib)
    os.makedirs(pkg)
    venv_lib = os.path.join(VENV_ROS, "lib")
    link = ["-L" + lib, "-L" + venv_lib, "-Wl,-rpath," + LIB_DIR, "-Wl,-rpath," + venv_lib]

    def shared(out: str, sources: List[str], libs: List[str], cxx_src: bool = False,
               extra: Sequence[str] = ()) -> None:
        argv = ([cxx, "-std=c++17"] if cxx_src else [cc]) + [
            "-shared", "-fPIC", "-O2", "-w", "-o", out, *incs, *extra, *sources, *link,
            *("-l" + x for x in libs)]
        _run(argv)

    def d(part: str, *p: str) -> str:
        return os.path.join(gen, part, "msg", *p)

    name = "tf2_msgs__rosidl_"
    shared(os.path.join(lib, "lib%sgenerator_c.so" % name),
           [d("c", "detail", f) for f in ("tf_message__description.c",
                                          "tf_message__functions.c",
                                          "tf_message__type_support.c")],
           ["geometry_msgs__rosidl_generator_c", "std_msgs__rosidl_generator_c",
            "builtin_interfaces__rosidl_generator_c", "rosidl_runtime_c", "rcutils"])
    shared(os.path.join(lib, "lib%stypesupport_introspection_c.so" % name),
           [d("introspection_c", "detail", "tf_message__type_support.c")],
           [name + "generator_c", "geometry_msgs__rosidl_typesupport_introspection_c",
            "rosidl_typesupport_introspection_c", "rosidl_runtime_c"])
    shared(os.path.join(lib, "lib%stypesupport_fastrtps_c.so" % name),
           [d("fastrtps_c", "detail", "tf_message__type_support_c.cpp")],
           [name + "generator_c", "geometry_msgs__rosidl_typesupport_fastrtps_c",
            "geometry_msgs__rosidl_generator_c", "rosidl_typesupport_fastrtps_c",
            "rosidl_typesupport_fastrtps_cpp", "fastcdr", "rosidl_runtime_c", "rcutils"],
           cxx_src=True)
    shared(os.path.join(lib, "lib%stypesupport_c.so" % name),
           [os.path.join(gen, "typesupport_c", "msg", "tf_message__type_support.cpp")],
           [name + "generator_c", "rosidl_typesupport_c", "rcpputils", "rcutils"], cxx_src=True)
    shared(os.path.join(lib, "lib%sgenerator_py.so" % name),
           [os.path.join(gen, "py", "msg", "_tf_message_s.c")],
           [name + "generator_c", "geometry_msgs__rosidl_generator_py",
            "geometry_msgs__rosidl_generator_c", "rosidl_runtime_c"],
           extra=["-I" + py_inc, "-I" + np_inc])
    for ts in _TYPESUPPORTS:
        shared(os.path.join(pkg, "tf2_msgs_s__%s.so" % ts),
               [os.path.join(gen, "py", "_tf2_msgs_s.ep.%s.c" % ts)],
               [name + "generator_py", name + ts[len("rosidl_"):], name + "generator_c",
                "rosidl_runtime_c"],
               extra=["-I" + py_inc, "-I" + np_inc])
    shutil.copytree(os.path.join(gen, "py", "msg"), os.path.join(pkg, "msg"),
                    ignore=shutil.ignore_patterns("*.c"))
    with open(os.path.join(pkg, "__init__.py"), "w") as f:
        f.write("")
    with open(os.path.join(tmp, "stamp"), "w") as f:
        f.write(stamp)
    shutil.rmtree(OUT, ignore_errors=True)
    os.rename(tmp, OUT)
    return OUT


if __name__ == "__main__":   # python -m tests.support.ros_msgs: build (or check) it now
    print(ensure_tf2_msgs(), file=sys.stdout)

"""Helpers every test directory shares (import them as ``tests.support.<module>``).

- ``qos``: the QoS presets of UBRB requests (reliable, best effort, latched).
- ``ubrb_frames``: client -> gateway frames (HELLO, ADVERTISE, ...) and splitting a byte stream
  into (op, payload) frames; built on the core's own encoders.
- ``clock``: the virtual millisecond clock that drives sans-IO parts deterministically.
- ``raw_client``: one blocking UBRB client on a real TCP socket (byte-level: for tests that send
  malformed input or watch exact frames; the client library is ``ubrb_client``).
- ``loopback_ports``: a free port on 127.0.0.1 (not ``ports``: that is the gateway's ports package).
- ``procs``: a subprocess with its output collected line by line, the environment of child
  processes (DDS confined to loopback), ``wait_for`` polling.
- ``dds``: DDS confined to loopback for this process.
- ``ros_idl``: hand-written IDL types of a few ROS messages, for an independent DDS participant.
- ``ros_msgs``: message packages the Kilted wheels lack (tf2_msgs), generated with the wheels'
  rosidl generators and compiled for .venv-ros (``ensure_tf2_msgs``; ``ros_procs.ros_env`` uses
  the build).
- ``netguard``: proof that a program's addresses stay on this machine: a child process's every
  connect/sendto/bind recorded and, off loopback, refused (``loopback_guard/sitecustomize.py``,
  always available), or the program run in a network namespace with only ``lo`` (``unshare -rn``).

``qos``, ``ubrb_frames`` and ``clock`` are also imported by tests/core under real MicroPython
(tests/mp/run.mjs copies this directory): keep them free of typing, pytest and CPython-only
modules. Benchmarks (bench/) import nothing from here; the serial line both use (real pty pairs
joined by a relay, optionally at a baud rate) is ``tools/ptyline.py``.
"""

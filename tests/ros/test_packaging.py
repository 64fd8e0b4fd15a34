"""ros_side as a ROS 2 ament_python package: the files colcon and ros2 run/launch rely on."""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET

from ros_side.cli import ros_params_as_flags, strip_ros_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_package_xml_is_format_3_ament_python_with_runtime_deps():
    root = ET.parse(os.path.join(ROOT, "package.xml")).getroot()
    assert root.get("format") == "3"
    assert root.findtext("name") == "ros_side"
    lic = root.find("license")
    assert lic.text == "Apache-2.0" and lic.get("file") == "LICENSE"
    assert "Apache License" in open(os.path.join(ROOT, "LICENSE")).read()
    assert root.find("export/build_type").text == "ament_python"
    deps = {e.text for e in root.findall("exec_depend")}
    assert "rclpy" in deps and "diagnostic_msgs" in deps
    assert "rosidl_runtime_py" not in deps      # the rclpy backend imports message classes itself


def test_setup_installs_the_marker_launch_file_and_console_script():
    out = subprocess.run(
        [sys.executable, "setup.py", "--name", "--version"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    # the distribution is the project's; the ROS package (package.xml) stays ros_side
    assert out.stdout.split()[:2] == ["ubrb-gateway", "0.1.0"]
    assert os.path.isfile(os.path.join(ROOT, "ros_side", "resource", "ros_side"))
    assert os.path.isfile(os.path.join(ROOT, "ros_side", "launch", "ros_side.launch.py"))
    setup_cfg = open(os.path.join(ROOT, "setup.cfg")).read()
    assert "script_dir=$base/lib/ros_side" in setup_cfg
    assert "ros_side = ros_side:main" in open(os.path.join(ROOT, "setup.py")).read()


def test_colcon_style_install_runs_as_ros2_run_finds_it(tmp_path):
    # What `colcon build` does for an ament_python package (colcon-core's python build: setup.py
    # egg_info/build/install with --install-scripts from setup.cfg), then what `ros2 run ros_side
    # ros_side` does: the package's prefix from the ament index (AMENT_PREFIX_PATH), its
    # executable in <prefix>/lib/ros_side/. The distribution is named ubrb-gateway, the ROS
    # package ros_side: both must hold. Run with the Kilted venv's python (ament_index_python).
    from tests.support.ros_procs import ROS_PYTHON, require_ros

    require_ros()
    build, prefix = tmp_path / "build", tmp_path / "install"
    build.mkdir()
    def tree():  # what git sees in the source tree, ignored files included (not bytecode)
        out = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=ROOT,
                             capture_output=True, text=True).stdout
        return [x for x in out.splitlines() if "__pycache__" not in x]

    before = tree()
    r = subprocess.run(
        [ROS_PYTHON, "setup.py", "egg_info", "--egg-base", str(build),
         "build", "--build-base", str(build / "build"),
         "install", "--prefix", str(prefix), "--record", str(build / "install.log"),
         "--install-scripts", str(prefix / "lib" / "ros_side"),
         "--single-version-externally-managed", "install_data"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert tree() == before, "the install wrote into the source tree"
    site = next(prefix.glob("lib/python3*/site-packages"))
    assert next(site.glob("ubrb_gateway-0.1.0-*.egg-info"))
    assert (prefix / "share" / "ament_index" / "resource_index" / "packages" / "ros_side").is_file()
    assert (prefix / "share" / "ros_side" / "package.xml").is_file()
    assert (prefix / "share" / "ros_side" / "launch" / "ros_side.launch.py").is_file()
    env = dict(os.environ, AMENT_PREFIX_PATH=str(prefix), PYTHONPATH=str(site))
    find = ("import os; from ament_index_python.packages import get_package_prefix; "
            "print(os.path.join(get_package_prefix('ros_side'), 'lib', 'ros_side', 'ros_side'))")
    r = subprocess.run([ROS_PYTHON, "-c", find], cwd="/", env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    exe = r.stdout.strip()
    assert exe == str(prefix / "lib" / "ros_side" / "ros_side")
    r = subprocess.run([exe, "--version"], cwd="/", env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("ros_side 0.1.0"), (r.stdout, r.stderr)


def test_ros_parameters_mirror_the_command_line_flags():
    argv = ["--backend", "dds", "--ros-args", "-p", "link:=serial:/dev/ttyACM0",
            "-p", "baud:=921600", "-p", "no_diagnostics:=true", "-r", "__node:=x", "--"]
    assert ros_params_as_flags(argv) == [   # -r: a remap rule, honoured by both backends
        "--link", "serial:/dev/ttyACM0", "--baud", "921600", "--no-diagnostics",
        "--remap", "__node:=x"]
    assert strip_ros_args(argv) == ["--backend", "dds"]


def test_ros_run_style_arguments_reach_the_parser():
    # `ros2 run ros_side ros_side --ros-args -p listen:=...` selects direct mode; --help proves
    # the parser accepts the mapped flags without starting anything.
    from ros_side.__main__ import build_parser

    args = build_parser().parse_args(
        ros_params_as_flags(["--ros-args", "-p", "listen:=127.0.0.1:0", "-p", "max_clients:=4"])
    )
    assert args.listen == "127.0.0.1:0" and args.max_clients == 4


# -- the launch file, without ROS's launch (not on PyPI, not in .venv-ros) --------------------
class _Sub:
    """Stand-ins for launch's substitutions, conditions and actions: what the launch file builds,
    evaluated as launch does (LaunchConfiguration: the argument's value; a list of
    substitutions: their texts joined into one argument; PythonExpression: eval of the text;
    IfCondition/UnlessCondition: "true"/"1" case-insensitively)."""

    def __init__(self, kind, *args, **kw):
        self.kind, self.args, self.kw = kind, args, kw


def _fake_launch(monkeypatch):
    import types

    def maker(kind):
        return lambda *a, **kw: _Sub(kind, *a, **kw)

    mods = {"launch": {"LaunchDescription": maker("description")},
            "launch.actions": {"DeclareLaunchArgument": maker("declare")},
            "launch.conditions": {"IfCondition": maker("if"), "UnlessCondition": maker("unless")},
            "launch.substitutions": {"LaunchConfiguration": maker("config"),
                                     "PythonExpression": maker("python")},
            "launch_ros": {}, "launch_ros.actions": {"Node": maker("node")}}
    for name, attrs in mods.items():
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, m)


def _text(sub, values):
    if isinstance(sub, str):
        return sub
    if isinstance(sub, list):
        return "".join(_text(s, values) for s in sub)
    if sub.kind == "config":
        return values[sub.args[0]]
    if sub.kind == "python":
        return str(eval(_text(sub.args[0], values)))
    raise AssertionError(sub.kind)


def _launch(monkeypatch, **given):
    """The command lines `ros2 launch ros_side ros_side.launch.py NAME:=VALUE ...` starts: the
    executable's arguments of every node whose condition holds."""
    import runpy

    _fake_launch(monkeypatch)
    path = os.path.join(ROOT, "ros_side", "launch", "ros_side.launch.py")
    desc = runpy.run_path(path)["generate_launch_description"]()
    entities = desc.args[0]
    values = {e.args[0]: e.kw["default_value"] for e in entities if e.kind == "declare"}
    assert set(given) <= set(values), "no such launch argument: %s" % (set(given) - set(values))
    values.update(given)
    runs = []
    for e in entities:
        if e.kind != "node":
            continue
        cond = e.kw["condition"]
        holds = _text(cond.args[0], values).lower() in ("true", "1")
        if holds == (cond.kind == "if"):
            assert (e.kw["package"], e.kw["executable"]) == ("ros_side", "ros_side")
            runs.append([_text(a, values) for a in e.kw["arguments"]])
    return runs


def test_launch_file_passes_the_link_key(monkeypatch, tmp_path):
    from ros_side.__main__ import build_parser
    from ubrb_host import cli as host_cli

    key = tmp_path / "link.key"
    key.write_text(os.urandom(32).hex() + "\n")
    os.chmod(key, 0o600)
    (argv,) = _launch(monkeypatch, link="udp://0.0.0.0:8269", link_key=str(key))
    args = build_parser().parse_args(argv)
    assert args.link == "udp://0.0.0.0:8269" and args.link_key == str(key)
    assert args.backend == "rclpy"
    assert host_cli.link_key(args) == bytes.fromhex(key.read_text().strip())
    # no key: a loopback link starts unkeyed; another address is refused (one line, exit 2)
    (argv,) = _launch(monkeypatch)
    args = build_parser().parse_args(argv)
    assert args.link == "udp://127.0.0.1:8269" and not args.link_key
    assert host_cli.link_key(args) is None
    (argv,) = _launch(monkeypatch, link="udp://0.0.0.0:8269")
    try:
        host_cli.link_key(build_parser().parse_args(argv))
    except host_cli.Fatal as e:
        assert e.code == 2 and "--link-key" in str(e)
    else:
        raise AssertionError("an unkeyed link off loopback was accepted")
    # direct mode: --listen, no link
    (argv,) = _launch(monkeypatch, listen="127.0.0.1:8268", backend="dds")
    args = build_parser().parse_args(argv)
    assert args.listen == "127.0.0.1:8268" and args.link is None and args.backend == "dds"

"""ros2 launch ros_side ros_side.launch.py link:=udp://127.0.0.1:8269 [backend:=rclpy] ...

A UDP link off loopback needs the link key (--link-key): run the node with
`ros2 run ros_side ros_side --ros-args -p link:=udp://0.0.0.0:8269 -p link_key:=/path/link.key`."""

from launch import LaunchDescription  # type: ignore[import-not-found,unused-ignore]
from launch.actions import DeclareLaunchArgument  # type: ignore[import-not-found,unused-ignore]
from launch.conditions import IfCondition, UnlessCondition  # type: ignore[import-not-found,unused-ignore]
from launch.substitutions import LaunchConfiguration, PythonExpression  # type: ignore[import-not-found,unused-ignore]
from launch_ros.actions import Node  # type: ignore[import-not-found,unused-ignore]


def generate_launch_description():
    link = LaunchConfiguration("link")
    listen = LaunchConfiguration("listen")
    backend = LaunchConfiguration("backend")
    direct = PythonExpression(["'", listen, "' != ''"])
    common = ["--backend", backend]
    return LaunchDescription([
        DeclareLaunchArgument("link", default_value="udp://127.0.0.1:8269",
                              description="udp://HOST:PORT or serial:PATH"),
        DeclareLaunchArgument("listen", default_value="",
                              description="direct mode HOST:PORT (overrides link)"),
        DeclareLaunchArgument("backend", default_value="rclpy",
                              description="auto|rclpy|dds"),
        Node(package="ros_side", executable="ros_side", name="ros_side", output="screen",
             arguments=["--link", link] + common, condition=UnlessCondition(direct)),
        Node(package="ros_side", executable="ros_side", name="ros_side", output="screen",
             arguments=["--listen", listen] + common, condition=IfCondition(direct)),
    ])

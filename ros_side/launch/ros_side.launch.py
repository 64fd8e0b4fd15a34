"""ros2 launch ros_side ros_side.launch.py link:=udp://0.0.0.0:8269 [backend:=rclpy] ..."""

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
        DeclareLaunchArgument("link", default_value="udp://0.0.0.0:8269",
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

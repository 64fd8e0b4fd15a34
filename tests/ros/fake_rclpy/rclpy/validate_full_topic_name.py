from .exceptions import InvalidTopicNameException


def validate_full_topic_name(name, *, is_service=False):
    # fake rule, distinct from ros_side.names, so the test can tell which check ran
    if not name.startswith("/") or "forbidden" in name:
        raise InvalidTopicNameException("fake rclpy rejects %r" % name)
    return True

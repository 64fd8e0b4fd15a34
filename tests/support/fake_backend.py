"""A scripted ROS backend for the companion's unit tests (tests/ros/test_companion_unit.py,
test_companion_budget.py): records what it is asked to create, destroy and publish; subscriber
counts and failures are set by the test."""


class FakeBackend:
    name = "fake"
    distro = "humble"

    def __init__(self):
        self.created = []
        self.destroyed = []
        self.published = []
        self.counts = {}
        self.callbacks = {}
        self.fail = None

    def create_publisher(self, topic, ros_type, qos):
        if self.fail:
            raise self.fail
        h = ("pub", topic, len(self.created))
        self.created.append(h)
        return h

    def destroy_publisher(self, h):
        self.destroyed.append(h)

    def publish(self, h, data):
        assert type(data) is bytes
        self.published.append((h[1], data))

    def subscription_count(self, h):
        return self.counts.get(h[1], 0)

    def create_subscription(self, topic, ros_type, qos, cb):
        h = ("sub", topic, len(self.created))
        self.created.append(h)
        self.callbacks[topic] = cb
        return h

    def destroy_subscription(self, h):
        self.destroyed.append(h)

    def close(self):
        pass

import threading


class GuardCondition:
    def __init__(self, node, callback):
        self.node, self.callback, self.triggered = node, callback, False

    def trigger(self):
        self.triggered = True
        self.node._executor._wake.set()


class Publisher:
    def __init__(self, node, cls, topic, qos):
        self.node, self.msg_type, self.topic, self.qos = node, cls, topic, qos
        self.published = []

    def publish(self, msg):
        if type(msg) is not bytes and not isinstance(msg, self.msg_type):
            raise TypeError("fake rclpy: publish takes the message class or bytes")
        self.published.append(msg)

    def get_subscription_count(self):
        # like DDS: foreign readers plus this node's own matched subscriptions
        own = sum(1 for s in self.node.subscriptions if s.topic == self.topic)
        return self.node.foreign_subscribers.get(self.topic, 0) + own


class Subscription:
    def __init__(self, node, cls, topic, callback, qos, raw):
        self.node, self.msg_type, self.topic = node, cls, topic
        self.callback, self.qos, self.raw = callback, qos, raw


class Node:
    def __init__(self, name):
        self.name = name
        self.guards = []
        self.publishers = []
        self.subscriptions = []
        self.foreign_subscribers = {}
        self.calls = []  # (what, thread)
        self.destroyed = False
        self.parameters = {}

    def has_parameter(self, name):
        return name in self.parameters

    def declare_parameter(self, name, value):
        self._log("declare_parameter")
        self.parameters[name] = value

    def _log(self, what):
        self.calls.append((what, threading.current_thread()))

    def create_guard_condition(self, callback):
        g = GuardCondition(self, callback)
        self.guards.append(g)
        return g

    def create_publisher(self, cls, topic, qos):
        self._log("create_publisher")
        p = Publisher(self, cls, topic, qos)
        self.publishers.append(p)
        return p

    def destroy_publisher(self, p):
        self._log("destroy_publisher")
        self.publishers.remove(p)

    def create_subscription(self, cls, topic, callback, qos, raw=False):
        self._log("create_subscription")
        s = Subscription(self, cls, topic, callback, qos, raw)
        self.subscriptions.append(s)
        return s

    def destroy_subscription(self, s):
        self._log("destroy_subscription")
        self.subscriptions.remove(s)

    def destroy_node(self):
        self.destroyed = True

"""Fake rclpy (tests only)."""
_state = {"ok": False, "init_kwargs": None}
nodes: list = []


def ok():
    return _state["ok"]


def init(args=None, domain_id=None):
    _state["ok"] = True
    _state["init_kwargs"] = {"args": args, "domain_id": domain_id}


def shutdown():
    _state["ok"] = False


def create_node(name):
    from .node import Node
    n = Node(name)
    nodes.append(n)
    return n


_KNOWN = {"std_msgs": {"String", "Bool"}, "geometry_msgs": {"Twist"}}


def get_message(identifier):
    # mirrors the three failure modes ros2cli catches
    parts = identifier.split("/")
    if len(parts) != 3 or parts[1] != "msg":
        raise ValueError("Expected the full name of a message, got '%s'" % identifier)
    pkg, _, name = parts
    if pkg not in _KNOWN:
        raise ModuleNotFoundError("No module named '%s'" % pkg)
    if name not in _KNOWN[pkg]:
        raise AttributeError("module '%s.msg' has no attribute '%s'" % (pkg, name))
    return type(name, (), {"__module__": pkg + ".msg"})



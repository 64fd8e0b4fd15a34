"""rcl's own name resolution, for ``test_names.py`` to compare ``ros_side.names`` against. Runs
under the Kilted venv's python (.venv-ros): reads one JSON list on stdin and prints one JSON list.

    {"node": N, "ns": NS, "rules": [RULE, ...], "names": [NAME, ...]}
        -> {"fqn": /ns/node, "names": {NAME: resolved or null}}: a node made with those remap
           rules (``cli_args``, no global arguments), ``Node.resolve_topic_name`` of each name
    {"rule": RULE} -> {"ok": bool}: whether rcl accepts ``-r RULE`` at all
"""

import json
import sys

import rclpy


def main():
    rclpy.init(args=[])
    out = []
    for case in json.load(sys.stdin):
        if "rule" in case:
            try:
                n = rclpy.create_node("n", use_global_arguments=False,
                                      cli_args=["--ros-args", "-r", case["rule"]])
            except Exception:
                out.append({"ok": False})
            else:
                n.destroy_node()
                out.append({"ok": True})
            continue
        args = ["--ros-args"] + [a for r in case["rules"] for a in ("-r", r)]
        n = rclpy.create_node(case["node"], namespace=case["ns"], use_global_arguments=False,
                              cli_args=args if case["rules"] else None)
        res = {"fqn": n.get_fully_qualified_name(), "names": {}}
        for name in case["names"]:
            try:
                res["names"][name] = n.resolve_topic_name(name)
            except Exception:   # rcl refuses it: invalid_topic here
                res["names"][name] = None
        out.append(res)
        n.destroy_node()
    rclpy.shutdown()
    print(json.dumps(out))


if __name__ == "__main__":
    main()

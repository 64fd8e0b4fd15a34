"""What checking link records costs the gateway end (LinkRosPort), CPython.

Prints, in one run: a MSG record (the data path: the registration-generation gate, one dict
lookup) next to the bare GatewaySink call it ends in; a RESULT record (JSON checked for length,
depth, shape, types and generation, then used) next to json.loads of the same bytes alone.

Usage: .venv/bin/python bench/link_records.py [--count N]
"""

from __future__ import annotations

import json
import os
import sys
import timeit
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "ports", "cpython"))  # ubrb_host
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ubrb_min as U  # noqa: E402
from ubrb_host import cli as host_cli  # noqa: E402


class Sink:
    def ros_message(self, slot: int, buf: Any, off: int, n: int) -> None:
        pass

    def ros_result(self, kind: str, slot: int, code: Any, message: str) -> None:
        pass


def best(fn: Any, n: int) -> float:
    return min(timeit.repeat(fn, number=n, repeat=5)) / n


def main() -> None:
    p = host_cli.script_parser("bench/link_records.py", __doc__ or "")
    p.add_argument("--count", type=host_cli.positive_int, default=200000)
    n = p.parse_args().count
    port = U.LinkRosPort(U.LinkSession(None, 1, True, True))
    sink = Sink()
    port.sink = sink
    port.gens[3 * 2 + 1] = 5            # sub slot 3, generation 5 accepted
    buf = bytes(64)
    body = json.dumps({"kind": "sub", "code": None, "message": "", "gen": 5}).encode()
    t_msg = best(lambda: port.link_message(U.LK_T_MSG, 3, buf, 0, 64, True), n)
    t_sink = best(lambda: sink.ros_message(3, buf, 0, 64), n)
    t_res = best(lambda: port.link_message(U.LK_T_RESULT, 3, body, 0, len(body), True), n // 4)
    t_json = best(lambda: json.loads(bytes(body).decode()), n // 4)
    print("MSG record, 64 B:   %6.0f ns   (the bare sink call: %.0f ns)" % (t_msg * 1e9, t_sink * 1e9))
    print("RESULT record:      %6.2f us   (json.loads of it alone: %.2f us)" % (t_res * 1e6,
                                                                            t_json * 1e6))


if __name__ == "__main__":
    main()

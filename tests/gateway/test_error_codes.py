"""One table of ERROR codes: ubrb_min.ERROR_CODES, docs/PROTOCOL.md's "ERROR codes" table and
every code the gateway, its policy and the companion emit are the same set (a code added in one
place only fails here)."""

from __future__ import annotations

import re
from pathlib import Path

import ubrb_min as U

ROOT = Path(__file__).resolve().parent.parent.parent
SOURCES = ["ubrb_min.py", "ubrb_setup.py", "ubrb_policy.py", "ubrb_keyed.py", "ubrb_stream.py", "ubrb_hold.py",
           *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "ros_side").rglob("*.py")),
           *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "ports").rglob("*.py"))]
# the ways a code leaves the source: an ERROR frame, a refusal, a ROS-side error or result
EMIT = re.compile(r"""(?:_error\([^,()]+,\s*[^,()]+,\s*|Refused\(|RosError\(|"code":\s*|"""
                  r"""ros_(?:result|error)\([^,()]+,\s*[^,()]+,\s*|should_report\()"([a-z_]+)\"""")


def emitted() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for rel in SOURCES:
        for m in EMIT.finditer((ROOT / rel).read_text()):
            found.setdefault(m.group(1), []).append(rel)
    return found


def documented() -> list[str]:
    text = (ROOT / "docs" / "PROTOCOL.md").read_text()
    section = text.split("## ERROR codes", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([a-z_]+)` \|", section, re.M)


def test_the_table_lists_every_code_once_in_the_core_order() -> None:
    assert len(set(U.ERROR_CODES)) == len(U.ERROR_CODES)
    assert documented() == list(U.ERROR_CODES)


def test_every_code_the_code_emits_is_in_the_table_and_each_is_emitted() -> None:
    found = emitted()
    unknown = {code: where for code, where in found.items() if code not in U.ERROR_CODES}
    assert unknown == {}
    # each code of the table is really sent by something (no stale row)
    assert [c for c in U.ERROR_CODES if c not in found] == []


def test_the_link_records_take_their_codes_from_the_table() -> None:
    assert set(U.LK_RESULT_CODES) <= set(U.ERROR_CODES)
    assert set(U.LK_ERROR_CODES) <= set(U.ERROR_CODES)
    assert "link_congested" in U.LK_RESULT_CODES and "link_congested" in U.LK_ERROR_CODES

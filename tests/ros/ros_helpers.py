"""Helpers of the companion's tests (imported as ``ros_helpers``; conftest.py imports it first).

Every DDS participant these tests create (in this process and in the subprocesses they start,
which inherit the environment) is confined to loopback by CYCLONEDDS_URI, set here before any
cyclonedds domain exists. Each pytest run uses its own DDS domain id so parallel runs on one
machine do not see each other.
"""


from tests.support.dds import confine_this_process
from tests.support.procs import ROOT, wait_for  # noqa: F401  (test_real_ros)

from tests.support.ros_procs import TEST_DOMAIN  # this run's DDS domain

confine_this_process(TEST_DOMAIN)


class RecordingSink:
    """A scripted GatewaySink: records every call as a tuple."""

    def __init__(self):
        self.calls = []

    def ros_up(self, distro, max_message):
        self.calls.append(("up", distro, max_message))

    def ros_down(self):
        self.calls.append(("down",))

    def ros_result(self, kind, slot, code, message):
        self.calls.append(("result", kind, slot, code, message))

    def ros_error(self, kind, slot, code, message):
        self.calls.append(("error", kind, slot, code, message))

    def ros_message(self, slot, buf, off, n):
        self.calls.append(("message", slot, bytes(memoryview(buf)[off:off + n])))

    def ros_sub_count(self, slot, count):
        self.calls.append(("count", slot, count))

    def of(self, kind):
        return [c for c in self.calls if c[0] == kind]

    def results(self):
        return [(c[1], c[2], c[3]) for c in self.of("result")]

    def messages(self, slot=None):
        return [c[2] for c in self.of("message") if slot is None or c[1] == slot]

    def counts(self, slot):
        return [c[2] for c in self.of("count") if c[1] == slot]

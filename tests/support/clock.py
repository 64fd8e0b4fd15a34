# A virtual millisecond clock: time advances a fixed step per round, so timers, retransmissions
# and baud-rate pacing are deterministic and fast (no sleeps).
# MicroPython-compatible: imported by tests/core under real MicroPython too.


class VirtualClock:
    """Base of the test rigs that drive sans-IO parts: a subclass's ``step(dt)`` does one round
    at ``self.now`` and advances ``now`` by ``dt``; ``run`` repeats it."""

    def __init__(self, now=0):
        self.now = now

    def step(self, dt=1):
        raise NotImplementedError

    def run(self, ms, dt=1, until=None):
        """Step for ``ms`` virtual milliseconds, or until ``until()`` is true. Returns whether
        ``until`` became true (True when there is no ``until``)."""
        end = self.now + ms
        while self.now < end:
            self.step(dt)
            if until is not None and until():
                return True
        return until is None

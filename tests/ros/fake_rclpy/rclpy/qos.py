import enum


class ReliabilityPolicy(enum.Enum):
    RELIABLE = 1
    BEST_EFFORT = 2


class DurabilityPolicy(enum.Enum):
    TRANSIENT_LOCAL = 1
    VOLATILE = 2


class HistoryPolicy(enum.Enum):
    KEEP_LAST = 1
    KEEP_ALL = 2


class QoSProfile:
    def __init__(self, **kw):
        self.__dict__.update(kw)

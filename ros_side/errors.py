"""The one exception type the ROS side raises towards the companion.

``RosError(code, message)``: ``code`` is an ERROR code of the UBRB spec
(``unknown_type``, ``invalid_topic``, ``type_conflict``, ``qos_conflict``,
``message_too_large``); the companion forwards it to the gateway unchanged.
"""


class RosError(Exception):
    def __init__(self, code, message=""):
        Exception.__init__(self, code, message)
        self.code = code
        self.message = message

    def __str__(self):
        return "%s: %s" % (self.code, self.message) if self.message else self.code

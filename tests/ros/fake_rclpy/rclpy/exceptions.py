class InvalidTopicNameException(Exception):
    pass

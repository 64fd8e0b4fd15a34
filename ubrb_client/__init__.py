"""UBRB v1 client: a CPython stand-in for the Unreal uBotROS plugin.

See docs/CLIENT.md. Library: ``Client`` (threaded runner) on top of ``ClientProtocol``
(sans-IO state machine). CLI: ``python -m ubrb_client {pub,echo,hz,bench,sim}``.
"""
from .client import Client, Publisher, Subscription, TfStaticPublisher, parse_server
from .protocol import (
                       PROFILES,
                       ClientProtocol,
                       ErrorReceived,
                       HelloAck,
                       Message,
                       PingReceived,
                       PongReceived,
                       ProtocolViolation,
                       QoS,
                       SubCount,
)

__all__ = [
                       "PROFILES",
                       "Client",
                       "ClientProtocol",
                       "ErrorReceived",
                       "HelloAck",
                       "Message",
                       "PingReceived",
                       "PongReceived",
                       "ProtocolViolation",
                       "Publisher",
                       "QoS",
                       "SubCount",
                       "Subscription",
                       "TfStaticPublisher",
                       "parse_server",
]
__version__ = "0.1.0"

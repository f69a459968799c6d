"""hourglass-kafka: the Python client of hourglass, delayed delivery for
Apache Kafka. ``Client`` blocks, ``AsyncClient`` is for asyncio; both
retry a call answered UNAVAILABLE (a schedule with the same id), and raise
an :class:`HourglassError` subclass, with the fields the server refused,
when a call fails. The generated gRPC stubs are ``hourglass_kafka.pb`` and
``hourglass_kafka.rpc``, for what the wrapper does not cover."""

from ._proto import hourglass_pb2 as pb
from ._proto import hourglass_pb2_grpc as rpc
from .client import AsyncClient, Client, Scheduled
from .errors import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    FieldViolation,
    HourglassError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)

__version__ = "0.2.0"

__all__ = [
    "AlreadyExists",
    "AsyncClient",
    "Client",
    "DeadlineExceeded",
    "FailedPrecondition",
    "FieldViolation",
    "HourglassError",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "Scheduled",
    "Unauthenticated",
    "Unavailable",
    "pb",
    "rpc",
]

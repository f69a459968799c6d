"""What a failed call raises: one exception class per gRPC status the server
answers with, each carrying the status code, the server's message and, for
a request it refused, which fields were wrong and why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import grpc


@dataclass(frozen=True)
class FieldViolation:
    """A field of the request and what is wrong with it, as the server says
    (``message.topic``: "topic 'x' does not exist ...")."""

    field: str
    description: str


class HourglassError(Exception):
    """A call the server refused or could not answer."""

    def __init__(self, code: grpc.StatusCode, message: str, violations: Optional[List[FieldViolation]] = None):
        self.code = code
        self.message = message
        self.violations: List[FieldViolation] = list(violations or [])
        shown = f"{code.name}: {message}"
        if self.violations:
            shown += " (" + "; ".join(f"{v.field}: {v.description}" for v in self.violations) + ")"
        super().__init__(shown)


class InvalidArgument(HourglassError):
    """The request is malformed or refused for what it says; see ``violations``."""


class NotFound(HourglassError):
    """No message (or series, or policy) with that id in the caller's space."""


class AlreadyExists(HourglassError):
    """The id is taken by a different message (schedule with ``replace=True`` to replace it)."""


class PermissionDenied(HourglassError):
    """The token may not use that topic, tenant or verb."""


class Unauthenticated(HourglassError):
    """No token, or one the server does not know."""


class ResourceExhausted(HourglassError):
    """A bound was reached (the backlog cap, a tenant's limit, request memory)."""


class FailedPrecondition(HourglassError):
    """The message is no longer in a state the call applies to."""


class Unavailable(HourglassError):
    """The server could not be reached or is not serving now; retried calls
    raise it once their retries are spent."""


class DeadlineExceeded(HourglassError):
    """The call took longer than its timeout."""


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}


def _violations(trailers) -> List[FieldViolation]:
    """The field violations of a google.rpc.BadRequest in the status details."""
    from google.rpc import error_details_pb2, status_pb2

    for key, value in trailers or ():
        if key != "grpc-status-details-bin":
            continue
        status = status_pb2.Status.FromString(value)
        found = []
        for detail in status.details:
            if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                found.extend(FieldViolation(v.field, v.description) for v in bad.field_violations)
        return found
    return []


def from_status(code: grpc.StatusCode, details: Optional[str], trailers) -> HourglassError:
    """The exception for a status the server answered."""
    cls = _BY_CODE.get(code, HourglassError)
    return cls(code, details or "", _violations(trailers))


def from_rpc_error(error: grpc.RpcError) -> HourglassError:
    """The exception for a failed call of grpcio's (sync or asyncio)."""
    trailers = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    return from_status(error.code(), error.details(), trailers)

"""The requests the clients send, built from Python values, and what is
shared by the sync and the asyncio client: the channel's credentials, the
retry rule and the outcomes' names."""

from __future__ import annotations

import datetime as _dt
import uuid
from typing import Iterable, Mapping, Optional, Tuple, Union

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from ._proto import hourglass_pb2 as pb

Bytes = Union[bytes, str]
When = Union[_dt.datetime, float, int]
Span = Union[_dt.timedelta, float, int]
Headers = Union[Mapping[str, Bytes], Iterable[Tuple[str, Bytes]]]

# Calls answered UNAVAILABLE are made again: the server was unreachable, or
# not serving for a moment (a restart, a shard moving in a cluster).
RETRIED = (grpc.StatusCode.UNAVAILABLE,)


def _bytes(value: Bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def timestamp(at: When) -> timestamp_pb2.Timestamp:
    """A point in time: an aware datetime, or Unix seconds."""
    out = timestamp_pb2.Timestamp()
    if isinstance(at, _dt.datetime):
        if at.tzinfo is None:
            raise ValueError("at: give a datetime with a time zone (datetime.now(timezone.utc)), not a naive one")
        out.FromDatetime(at.astimezone(_dt.timezone.utc))
    else:
        out.FromNanoseconds(_nanos(at))
    return out


def _nanos(seconds: Union[float, int]) -> int:
    """Seconds as nanoseconds, exact for whole seconds and to the
    microsecond for a float (whose own precision is about that)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{seconds!r}: give a number of seconds")
    if isinstance(seconds, int):
        return seconds * 1_000_000_000
    return round(seconds * 1_000_000) * 1_000


def duration(span: Span) -> duration_pb2.Duration:
    """A length of time: a timedelta, or seconds."""
    out = duration_pb2.Duration()
    if isinstance(span, _dt.timedelta):
        out.FromTimedelta(span)
    else:
        out.FromNanoseconds(_nanos(span))
    return out


def when(ts: timestamp_pb2.Timestamp) -> _dt.datetime:
    return ts.ToDatetime(tzinfo=_dt.timezone.utc)


def new_id() -> str:
    """An id for a message scheduled without one, made here so that a retry
    names the same message."""
    return uuid.uuid4().hex


def message(topic: str, value: Bytes, key: Optional[Bytes], headers: Optional[Headers], partition: Optional[int]) -> pb.Message:
    pairs = headers.items() if isinstance(headers, Mapping) else (headers or [])
    msg = pb.Message(topic=topic, value=_bytes(value), headers=[pb.Header(key=k, value=_bytes(v)) for k, v in pairs])
    if key is not None:
        msg.key = _bytes(key)
    if partition is not None:
        msg.partition = partition
    return msg


def schedule_request(
    topic: str,
    value: Bytes,
    *,
    at: Optional[When],
    delay: Optional[Span],
    key: Optional[Bytes],
    id: Optional[str],
    labels: Optional[Mapping[str, str]],
    headers: Optional[Headers],
    partition: Optional[int],
    max_lateness: Optional[Span],
    dead_letter_topic: Optional[str],
    replace: bool,
) -> pb.ScheduleRequest:
    if at is not None and delay is not None:
        raise ValueError("give at or delay, not both")
    request = pb.ScheduleRequest(
        message=message(topic, value, key, headers, partition),
        id=id if id is not None else new_id(),
        labels=dict(labels or {}),
        dead_letter_topic=dead_letter_topic or "",
        on_conflict=pb.ON_CONFLICT_REPLACE if replace else pb.ON_CONFLICT_REJECT,
    )
    if at is not None:
        request.deliver_at.CopyFrom(timestamp(at))
    else:
        request.delay.CopyFrom(duration(delay or 0))
    if max_lateness is not None:
        request.max_lateness.CopyFrom(duration(max_lateness))
    return request


def reschedule_request(id: str, at: Optional[When], delay: Optional[Span]) -> pb.RescheduleRequest:
    if (at is None) == (delay is None):
        raise ValueError("give at or delay (one of them)")
    request = pb.RescheduleRequest(id=id)
    if at is not None:
        request.deliver_at.CopyFrom(timestamp(at))
    else:
        request.delay.CopyFrom(duration(delay))
    return request


def series_request(
    id: str,
    topic: str,
    value: Bytes,
    *,
    cron: Optional[str],
    interval: Optional[Span],
    time_zone: str,
    key: Optional[Bytes],
    headers: Optional[Headers],
    labels: Optional[Mapping[str, str]],
    start: Optional[When],
    end: Optional[When],
    count: int,
) -> pb.CreateSeriesRequest:
    if (cron is None) == (interval is None):
        raise ValueError("give cron or interval (one of them)")
    spec = pb.SeriesSpec(
        template=message(topic, value, key, headers, None),
        time_zone=time_zone,
        count=count,
        labels=dict(labels or {}),
    )
    if cron is not None:
        spec.cron = cron
    else:
        spec.interval.CopyFrom(duration(interval))
    if start is not None:
        spec.start.CopyFrom(timestamp(start))
    if end is not None:
        spec.end.CopyFrom(timestamp(end))
    return pb.CreateSeriesRequest(id=id, spec=spec)


def name_of(enum, value: int, prefix: str) -> str:
    """An enum value's name without its prefix, lower case; `unknown_N` for
    one a newer server answers that this client does not know."""
    try:
        return enum.Name(value).removeprefix(prefix).lower()
    except ValueError:
        return f"unknown_{value}"


def cancel_outcome(response: pb.CancelResponse) -> str:
    """`cancelled`, `already_delivered`, `already_cancelled`, `not_found`..."""
    return name_of(pb.CancelOutcome, response.outcome, "CANCEL_OUTCOME_")


def credentials(
    tls: bool,
    ca_cert: Optional[bytes],
    client_cert: Optional[bytes],
    client_key: Optional[bytes],
) -> Optional[grpc.ChannelCredentials]:
    """TLS credentials, or none for plaintext."""
    if (client_cert is None) != (client_key is None):
        raise ValueError("client_cert and client_key go together (mutual TLS)")
    if not (tls or ca_cert or client_cert):
        return None
    return grpc.ssl_channel_credentials(root_certificates=ca_cert, private_key=client_key, certificate_chain=client_cert)


def target_of(target: str) -> Tuple[str, bool]:
    """`host:port`, and whether the URL asked for TLS (https://)."""
    for scheme, tls in (("https://", True), ("http://", False)):
        if target[: len(scheme)].lower() == scheme:
            return target[len(scheme):].rstrip("/"), tls
    return target, False


def metadata(token: Optional[str]):
    return (("authorization", f"Bearer {token}"),) if token else ()

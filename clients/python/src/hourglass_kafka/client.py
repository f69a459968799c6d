"""The clients: :class:`Client` (blocking) and :class:`AsyncClient`
(asyncio), the same verbs on both."""

from __future__ import annotations

import asyncio
import datetime as _dt
import time
from dataclasses import dataclass
from typing import AsyncIterator, Iterator, Mapping, Optional

import grpc

from . import _calls as c
from ._proto import hourglass_pb2 as pb
from ._proto import hourglass_pb2_grpc as rpc
from .errors import from_rpc_error


@dataclass(frozen=True)
class Scheduled:
    """What a schedule came to: the message's id, when it is due, and
    whether the server had it already (a retry of the same request)."""

    id: str
    deliver_at: _dt.datetime
    duplicate: bool
    #: ``created``, ``duplicate`` or ``replaced``
    outcome: str


def _scheduled(response: pb.ScheduleResponse) -> Scheduled:
    outcome = c.name_of(pb.ScheduleOutcome, response.outcome, "SCHEDULE_OUTCOME_")
    return Scheduled(response.id, c.when(response.deliver_at), response.duplicate, outcome)


def _read(path: Optional[str]) -> Optional[bytes]:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


class _Base:
    def __init__(
        self,
        target: str,
        token: Optional[str],
        tls: bool,
        ca_cert: Optional[str],
        client_cert: Optional[str],
        client_key: Optional[str],
        timeout: float,
        retries: int,
        retry_backoff: float,
    ):
        self._address, url_tls = c.target_of(target)
        self._credentials = c.credentials(tls or url_tls, _read(ca_cert), _read(client_cert), _read(client_key))
        self._metadata = c.metadata(token)
        self._timeout = timeout
        self._retries = max(0, retries)
        self._backoff = retry_backoff

    def _pause(self, attempt: int) -> float:
        return min(self._backoff * (2**attempt), 5.0)


class Client(_Base):
    """A blocking client.

    ``target``: ``host:port`` (plaintext), or ``https://host:port`` for TLS.
    ``token``: the bearer token of a server with ``--auth-tokens``.
    ``ca_cert``, ``client_cert``, ``client_key``: PEM files, for a private
    CA and mutual TLS. ``timeout``: seconds per call. ``retries``: how many
    times a call answered UNAVAILABLE is made again (a schedule keeps its
    id, so a retry is answered as a duplicate, never parked twice).

    >>> with Client("127.0.0.1:50051") as hg:
    ...     hg.schedule("reminders", b"class starts in 10 minutes", delay=600, id="class-7")
    """

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        token: Optional[str] = None,
        tls: bool = False,
        ca_cert: Optional[str] = None,
        client_cert: Optional[str] = None,
        client_key: Optional[str] = None,
        timeout: float = 10.0,
        retries: int = 3,
        retry_backoff: float = 0.2,
    ):
        super().__init__(target, token, tls, ca_cert, client_cert, client_key, timeout, retries, retry_backoff)
        if self._credentials is None:
            self._channel = grpc.insecure_channel(self._address)
        else:
            self._channel = grpc.secure_channel(self._address, self._credentials)
        self._scheduler = rpc.SchedulerStub(self._channel)
        self._series = rpc.SeriesStub(self._channel)
        self._admin = rpc.AdminStub(self._channel)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(self, method, request, *, gone_is_done: bool = False):
        for attempt in range(self._retries + 1):
            try:
                # A retry waits for the connection to come back, up to its
                # timeout, rather than failing at once while it is down.
                return method(request, timeout=self._timeout, metadata=self._metadata, wait_for_ready=attempt > 0)
            except grpc.RpcError as e:
                if gone_is_done and attempt > 0 and e.code() == grpc.StatusCode.NOT_FOUND:
                    return None
                if e.code() not in c.RETRIED or attempt == self._retries:
                    raise from_rpc_error(e) from None
            time.sleep(self._pause(attempt))

    def schedule(
        self,
        topic: str,
        value: c.Bytes,
        *,
        at: Optional[c.When] = None,
        delay: Optional[c.Span] = None,
        key: Optional[c.Bytes] = None,
        id: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        headers: Optional[c.Headers] = None,
        partition: Optional[int] = None,
        max_lateness: Optional[c.Span] = None,
        dead_letter_topic: Optional[str] = None,
        replace: bool = False,
    ) -> Scheduled:
        """Parks a record for ``topic``, due ``at`` (an aware datetime or
        Unix seconds) or after ``delay`` (a timedelta or seconds; now if
        neither). ``id``: your idempotency key (one is made if you give
        none); ``replace``: replace a pending message under the same id."""
        request = c.schedule_request(
            topic, value, at=at, delay=delay, key=key, id=id, labels=labels, headers=headers,
            partition=partition, max_lateness=max_lateness, dead_letter_topic=dead_letter_topic, replace=replace,
        )
        return _scheduled(self._call(self._scheduler.Schedule, request))

    def cancel(self, id: str) -> str:
        """Cancels a pending message; says what came of it: ``cancelled``,
        ``already_delivered``, ``already_cancelled``, ``not_found``... (a
        cancel retried after UNAVAILABLE may say ``already_cancelled``)."""
        return c.cancel_outcome(self._call(self._scheduler.Cancel, pb.CancelRequest(id=id)))

    def reschedule(self, id: str, *, at: Optional[c.When] = None, delay: Optional[c.Span] = None) -> _dt.datetime:
        """Moves a pending message to a new due time; returns it."""
        response = self._call(self._scheduler.Reschedule, c.reschedule_request(id, at, delay))
        return c.when(response.deliver_at)

    def get(self, id: str) -> pb.GetResponse:
        """A message, pending or settled: its state, record and, once
        delivered, where it landed (``delivered.partition``, ``.offset``)."""
        return self._call(self._scheduler.Get, pb.GetRequest(id=id))

    def list(self, *, topic: str = "", selector: str = "", page_size: int = 100) -> Iterator[pb.PendingMessage]:
        """Pending messages in dispatch order, page after page."""
        token = ""
        while True:
            request = pb.ListRequest(topic=topic, selector=selector, page_size=page_size, page_token=token)
            page = self._call(self._scheduler.List, request)
            yield from page.messages
            token = page.next_page_token
            if not token:
                return

    def create_series(self, id: str, topic: str, value: c.Bytes, *, cron: Optional[str] = None,
                      interval: Optional[c.Span] = None, time_zone: str = "", key: Optional[c.Bytes] = None,
                      headers: Optional[c.Headers] = None, labels: Optional[Mapping[str, str]] = None,
                      start: Optional[c.When] = None, end: Optional[c.When] = None, count: int = 0) -> pb.SeriesInfo:
        """A recurring schedule: a record by ``cron`` in ``time_zone``, or
        every ``interval``. The same request again is answered with the
        series as it is."""
        request = c.series_request(id, topic, value, cron=cron, interval=interval, time_zone=time_zone, key=key,
                                   headers=headers, labels=labels, start=start, end=end, count=count)
        return self._call(self._series.CreateSeries, request).series

    def get_series(self, id: str) -> pb.SeriesInfo:
        return self._call(self._series.GetSeries, pb.GetSeriesRequest(id=id))

    def delete_series(self, id: str) -> None:
        """Deletes a series and cancels its parked occurrences. (A retry
        that finds it gone was answered by the first try.)"""
        self._call(self._series.DeleteSeries, pb.DeleteSeriesRequest(id=id), gone_is_done=True)

    def pause_topic(self, topic: str) -> pb.TopicPolicy:
        """Holds the topic's due messages back until :meth:`resume_topic`."""
        return self._call(self._admin.PauseTopic, pb.TopicPolicyRequest(topic=topic))

    def resume_topic(self, topic: str) -> pb.TopicPolicy:
        return self._call(self._admin.ResumeTopic, pb.TopicPolicyRequest(topic=topic))

    def set_rate_limit(self, topic: str, per_second: int, burst: int = 0) -> pb.TopicPolicy:
        """Limits how fast the topic's messages go out (0: no limit)."""
        request = pb.SetRateLimitRequest(topic=topic, per_second=per_second, burst=burst)
        return self._call(self._admin.SetRateLimit, request)

    def topic_policy(self, topic: str) -> pb.TopicPolicy:
        return self._call(self._admin.GetTopicPolicy, pb.TopicPolicyRequest(topic=topic))


class AsyncClient(_Base):
    """The asyncio client: :class:`Client`'s verbs, each a coroutine
    (``list`` an async iterator). Make it inside a running event loop."""

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        token: Optional[str] = None,
        tls: bool = False,
        ca_cert: Optional[str] = None,
        client_cert: Optional[str] = None,
        client_key: Optional[str] = None,
        timeout: float = 10.0,
        retries: int = 3,
        retry_backoff: float = 0.2,
    ):
        super().__init__(target, token, tls, ca_cert, client_cert, client_key, timeout, retries, retry_backoff)
        if self._credentials is None:
            self._channel = grpc.aio.insecure_channel(self._address)
        else:
            self._channel = grpc.aio.secure_channel(self._address, self._credentials)
        self._scheduler = rpc.SchedulerStub(self._channel)
        self._series = rpc.SeriesStub(self._channel)
        self._admin = rpc.AdminStub(self._channel)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *_) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, method, request, *, gone_is_done: bool = False):
        for attempt in range(self._retries + 1):
            try:
                return await method(
                    request, timeout=self._timeout, metadata=self._metadata, wait_for_ready=attempt > 0
                )
            except grpc.RpcError as e:
                if gone_is_done and attempt > 0 and e.code() == grpc.StatusCode.NOT_FOUND:
                    return None
                if e.code() not in c.RETRIED or attempt == self._retries:
                    raise from_rpc_error(e) from None
            await asyncio.sleep(self._pause(attempt))

    async def schedule(
        self,
        topic: str,
        value: c.Bytes,
        *,
        at: Optional[c.When] = None,
        delay: Optional[c.Span] = None,
        key: Optional[c.Bytes] = None,
        id: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        headers: Optional[c.Headers] = None,
        partition: Optional[int] = None,
        max_lateness: Optional[c.Span] = None,
        dead_letter_topic: Optional[str] = None,
        replace: bool = False,
    ) -> Scheduled:
        """See :meth:`Client.schedule`."""
        request = c.schedule_request(
            topic, value, at=at, delay=delay, key=key, id=id, labels=labels, headers=headers,
            partition=partition, max_lateness=max_lateness, dead_letter_topic=dead_letter_topic, replace=replace,
        )
        return _scheduled(await self._call(self._scheduler.Schedule, request))

    async def cancel(self, id: str) -> str:
        return c.cancel_outcome(await self._call(self._scheduler.Cancel, pb.CancelRequest(id=id)))

    async def reschedule(self, id: str, *, at: Optional[c.When] = None, delay: Optional[c.Span] = None) -> _dt.datetime:
        response = await self._call(self._scheduler.Reschedule, c.reschedule_request(id, at, delay))
        return c.when(response.deliver_at)

    async def get(self, id: str) -> pb.GetResponse:
        return await self._call(self._scheduler.Get, pb.GetRequest(id=id))

    async def list(self, *, topic: str = "", selector: str = "", page_size: int = 100) -> AsyncIterator[pb.PendingMessage]:
        token = ""
        while True:
            request = pb.ListRequest(topic=topic, selector=selector, page_size=page_size, page_token=token)
            page = await self._call(self._scheduler.List, request)
            for m in page.messages:
                yield m
            token = page.next_page_token
            if not token:
                return

    async def create_series(self, id: str, topic: str, value: c.Bytes, *, cron: Optional[str] = None,
                            interval: Optional[c.Span] = None, time_zone: str = "", key: Optional[c.Bytes] = None,
                            headers: Optional[c.Headers] = None, labels: Optional[Mapping[str, str]] = None,
                            start: Optional[c.When] = None, end: Optional[c.When] = None,
                            count: int = 0) -> pb.SeriesInfo:
        request = c.series_request(id, topic, value, cron=cron, interval=interval, time_zone=time_zone, key=key,
                                   headers=headers, labels=labels, start=start, end=end, count=count)
        return (await self._call(self._series.CreateSeries, request)).series

    async def get_series(self, id: str) -> pb.SeriesInfo:
        return await self._call(self._series.GetSeries, pb.GetSeriesRequest(id=id))

    async def delete_series(self, id: str) -> None:
        await self._call(self._series.DeleteSeries, pb.DeleteSeriesRequest(id=id), gone_is_done=True)

    async def pause_topic(self, topic: str) -> pb.TopicPolicy:
        return await self._call(self._admin.PauseTopic, pb.TopicPolicyRequest(topic=topic))

    async def resume_topic(self, topic: str) -> pb.TopicPolicy:
        return await self._call(self._admin.ResumeTopic, pb.TopicPolicyRequest(topic=topic))

    async def set_rate_limit(self, topic: str, per_second: int, burst: int = 0) -> pb.TopicPolicy:
        request = pb.SetRateLimitRequest(topic=topic, per_second=per_second, burst=burst)
        return await self._call(self._admin.SetRateLimit, request)

    async def topic_policy(self, topic: str) -> pb.TopicPolicy:
        return await self._call(self._admin.GetTopicPolicy, pb.TopicPolicyRequest(topic=topic))

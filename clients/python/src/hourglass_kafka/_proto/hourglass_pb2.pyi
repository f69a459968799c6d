import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OnConflict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ON_CONFLICT_UNSPECIFIED: _ClassVar[OnConflict]
    ON_CONFLICT_REJECT: _ClassVar[OnConflict]
    ON_CONFLICT_REPLACE: _ClassVar[OnConflict]

class ScheduleOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCHEDULE_OUTCOME_UNSPECIFIED: _ClassVar[ScheduleOutcome]
    SCHEDULE_OUTCOME_CREATED: _ClassVar[ScheduleOutcome]
    SCHEDULE_OUTCOME_DUPLICATE: _ClassVar[ScheduleOutcome]
    SCHEDULE_OUTCOME_REPLACED: _ClassVar[ScheduleOutcome]

class CancelOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CANCEL_OUTCOME_UNSPECIFIED: _ClassVar[CancelOutcome]
    CANCEL_OUTCOME_CANCELLED: _ClassVar[CancelOutcome]
    CANCEL_OUTCOME_ALREADY_DELIVERED: _ClassVar[CancelOutcome]
    CANCEL_OUTCOME_ALREADY_CANCELLED: _ClassVar[CancelOutcome]
    CANCEL_OUTCOME_NOT_FOUND: _ClassVar[CancelOutcome]
    CANCEL_OUTCOME_ALREADY_FAILED: _ClassVar[CancelOutcome]
    CANCEL_OUTCOME_ALREADY_EXPIRED: _ClassVar[CancelOutcome]
    CANCEL_OUTCOME_ALREADY_DEAD_LETTERED: _ClassVar[CancelOutcome]

class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATE_UNSPECIFIED: _ClassVar[State]
    STATE_PENDING: _ClassVar[State]
    STATE_DELIVERED: _ClassVar[State]
    STATE_CANCELLED: _ClassVar[State]
    STATE_FAILED: _ClassVar[State]
    STATE_EXPIRED: _ClassVar[State]
    STATE_DEAD_LETTERED: _ClassVar[State]

class HeldReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HELD_REASON_UNSPECIFIED: _ClassVar[HeldReason]
    HELD_REASON_PAUSED: _ClassVar[HeldReason]
    HELD_REASON_RATE_LIMITED: _ClassVar[HeldReason]

class MissedPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MISSED_POLICY_UNSPECIFIED: _ClassVar[MissedPolicy]
    MISSED_POLICY_SKIP: _ClassVar[MissedPolicy]
    MISSED_POLICY_FIRE_ONE: _ClassVar[MissedPolicy]
    MISSED_POLICY_FIRE_EACH: _ClassVar[MissedPolicy]

class SeriesState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SERIES_STATE_UNSPECIFIED: _ClassVar[SeriesState]
    SERIES_STATE_ACTIVE: _ClassVar[SeriesState]
    SERIES_STATE_PAUSED: _ClassVar[SeriesState]
    SERIES_STATE_FINISHED: _ClassVar[SeriesState]

class CopyRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COPY_ROLE_UNSPECIFIED: _ClassVar[CopyRole]
    COPY_ROLE_OWNER: _ClassVar[CopyRole]
    COPY_ROLE_STANDBY: _ClassVar[CopyRole]
    COPY_ROLE_TAKING: _ClassVar[CopyRole]
    COPY_ROLE_LETTING_GO: _ClassVar[CopyRole]
ON_CONFLICT_UNSPECIFIED: OnConflict
ON_CONFLICT_REJECT: OnConflict
ON_CONFLICT_REPLACE: OnConflict
SCHEDULE_OUTCOME_UNSPECIFIED: ScheduleOutcome
SCHEDULE_OUTCOME_CREATED: ScheduleOutcome
SCHEDULE_OUTCOME_DUPLICATE: ScheduleOutcome
SCHEDULE_OUTCOME_REPLACED: ScheduleOutcome
CANCEL_OUTCOME_UNSPECIFIED: CancelOutcome
CANCEL_OUTCOME_CANCELLED: CancelOutcome
CANCEL_OUTCOME_ALREADY_DELIVERED: CancelOutcome
CANCEL_OUTCOME_ALREADY_CANCELLED: CancelOutcome
CANCEL_OUTCOME_NOT_FOUND: CancelOutcome
CANCEL_OUTCOME_ALREADY_FAILED: CancelOutcome
CANCEL_OUTCOME_ALREADY_EXPIRED: CancelOutcome
CANCEL_OUTCOME_ALREADY_DEAD_LETTERED: CancelOutcome
STATE_UNSPECIFIED: State
STATE_PENDING: State
STATE_DELIVERED: State
STATE_CANCELLED: State
STATE_FAILED: State
STATE_EXPIRED: State
STATE_DEAD_LETTERED: State
HELD_REASON_UNSPECIFIED: HeldReason
HELD_REASON_PAUSED: HeldReason
HELD_REASON_RATE_LIMITED: HeldReason
MISSED_POLICY_UNSPECIFIED: MissedPolicy
MISSED_POLICY_SKIP: MissedPolicy
MISSED_POLICY_FIRE_ONE: MissedPolicy
MISSED_POLICY_FIRE_EACH: MissedPolicy
SERIES_STATE_UNSPECIFIED: SeriesState
SERIES_STATE_ACTIVE: SeriesState
SERIES_STATE_PAUSED: SeriesState
SERIES_STATE_FINISHED: SeriesState
COPY_ROLE_UNSPECIFIED: CopyRole
COPY_ROLE_OWNER: CopyRole
COPY_ROLE_STANDBY: CopyRole
COPY_ROLE_TAKING: CopyRole
COPY_ROLE_LETTING_GO: CopyRole

class Header(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("topic", "key", "value", "headers", "partition")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    key: bytes
    value: bytes
    headers: _containers.RepeatedCompositeFieldContainer[Header]
    partition: int
    def __init__(self, topic: _Optional[str] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., headers: _Optional[_Iterable[_Union[Header, _Mapping]]] = ..., partition: _Optional[int] = ...) -> None: ...

class ScheduleRequest(_message.Message):
    __slots__ = ("message", "deliver_at", "delay", "id", "on_conflict", "labels", "max_lateness", "dead_letter_topic")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    ON_CONFLICT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    MAX_LATENESS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_TOPIC_FIELD_NUMBER: _ClassVar[int]
    message: Message
    deliver_at: _timestamp_pb2.Timestamp
    delay: _duration_pb2.Duration
    id: str
    on_conflict: OnConflict
    labels: _containers.ScalarMap[str, str]
    max_lateness: _duration_pb2.Duration
    dead_letter_topic: str
    def __init__(self, message: _Optional[_Union[Message, _Mapping]] = ..., deliver_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., id: _Optional[str] = ..., on_conflict: _Optional[_Union[OnConflict, str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., max_lateness: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., dead_letter_topic: _Optional[str] = ...) -> None: ...

class ScheduleResponse(_message.Message):
    __slots__ = ("id", "deliver_at", "duplicate", "outcome")
    ID_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    id: str
    deliver_at: _timestamp_pb2.Timestamp
    duplicate: bool
    outcome: ScheduleOutcome
    def __init__(self, id: _Optional[str] = ..., deliver_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., duplicate: _Optional[bool] = ..., outcome: _Optional[_Union[ScheduleOutcome, str]] = ...) -> None: ...

class ScheduleBatchRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[ScheduleRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[ScheduleRequest, _Mapping]]] = ...) -> None: ...

class ScheduleBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ScheduleResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ScheduleResult, _Mapping]]] = ...) -> None: ...

class ScheduleResult(_message.Message):
    __slots__ = ("index", "scheduled", "error")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    index: int
    scheduled: ScheduleResponse
    error: ItemError
    def __init__(self, index: _Optional[int] = ..., scheduled: _Optional[_Union[ScheduleResponse, _Mapping]] = ..., error: _Optional[_Union[ItemError, _Mapping]] = ...) -> None: ...

class ItemError(_message.Message):
    __slots__ = ("code", "message", "field")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    field: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., field: _Optional[str] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("id", "selector", "topic", "tenant")
    ID_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    id: str
    selector: str
    topic: str
    tenant: str
    def __init__(self, id: _Optional[str] = ..., selector: _Optional[str] = ..., topic: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("outcome",)
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    outcome: CancelOutcome
    def __init__(self, outcome: _Optional[_Union[CancelOutcome, str]] = ...) -> None: ...

class RescheduleRequest(_message.Message):
    __slots__ = ("id", "deliver_at", "delay", "tenant")
    ID_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    id: str
    deliver_at: _timestamp_pb2.Timestamp
    delay: _duration_pb2.Duration
    tenant: str
    def __init__(self, id: _Optional[str] = ..., deliver_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., tenant: _Optional[str] = ...) -> None: ...

class RescheduleResponse(_message.Message):
    __slots__ = ("deliver_at",)
    DELIVER_AT_FIELD_NUMBER: _ClassVar[int]
    deliver_at: _timestamp_pb2.Timestamp
    def __init__(self, deliver_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("id", "tenant")
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant: str
    def __init__(self, id: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("partition", "offset", "delivered_at")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_AT_FIELD_NUMBER: _ClassVar[int]
    partition: int
    offset: int
    delivered_at: _timestamp_pb2.Timestamp
    def __init__(self, partition: _Optional[int] = ..., offset: _Optional[int] = ..., delivered_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Cancellation(_message.Message):
    __slots__ = ("cancelled_at",)
    CANCELLED_AT_FIELD_NUMBER: _ClassVar[int]
    cancelled_at: _timestamp_pb2.Timestamp
    def __init__(self, cancelled_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ("reason", "failed_at")
    REASON_FIELD_NUMBER: _ClassVar[int]
    FAILED_AT_FIELD_NUMBER: _ClassVar[int]
    reason: str
    failed_at: _timestamp_pb2.Timestamp
    def __init__(self, reason: _Optional[str] = ..., failed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Expiry(_message.Message):
    __slots__ = ("expired_at", "deadline")
    EXPIRED_AT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    expired_at: _timestamp_pb2.Timestamp
    deadline: _timestamp_pb2.Timestamp
    def __init__(self, expired_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("dead_lettered_at", "topic", "partition", "offset", "reason", "error", "deadline")
    DEAD_LETTERED_AT_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    dead_lettered_at: _timestamp_pb2.Timestamp
    topic: str
    partition: int
    offset: int
    reason: str
    error: str
    deadline: _timestamp_pb2.Timestamp
    def __init__(self, dead_lettered_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., reason: _Optional[str] = ..., error: _Optional[str] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("id", "message", "deliver_at", "scheduled_at", "state", "attempts", "last_error", "delivered", "cancelled", "failed", "expired", "dead_lettered", "tenant", "labels", "max_lateness", "dead_letter_topic", "body_dropped")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_AT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    MAX_LATENESS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_TOPIC_FIELD_NUMBER: _ClassVar[int]
    BODY_DROPPED_FIELD_NUMBER: _ClassVar[int]
    id: str
    message: Message
    deliver_at: _timestamp_pb2.Timestamp
    scheduled_at: _timestamp_pb2.Timestamp
    state: State
    attempts: int
    last_error: str
    delivered: Delivery
    cancelled: Cancellation
    failed: Failure
    expired: Expiry
    dead_lettered: DeadLetter
    tenant: str
    labels: _containers.ScalarMap[str, str]
    max_lateness: _duration_pb2.Duration
    dead_letter_topic: str
    body_dropped: bool
    def __init__(self, id: _Optional[str] = ..., message: _Optional[_Union[Message, _Mapping]] = ..., deliver_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., scheduled_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state: _Optional[_Union[State, str]] = ..., attempts: _Optional[int] = ..., last_error: _Optional[str] = ..., delivered: _Optional[_Union[Delivery, _Mapping]] = ..., cancelled: _Optional[_Union[Cancellation, _Mapping]] = ..., failed: _Optional[_Union[Failure, _Mapping]] = ..., expired: _Optional[_Union[Expiry, _Mapping]] = ..., dead_lettered: _Optional[_Union[DeadLetter, _Mapping]] = ..., tenant: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., max_lateness: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., dead_letter_topic: _Optional[str] = ..., body_dropped: _Optional[bool] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("topic", "due_from", "due_to", "page_size", "page_token", "dispatch_from", "dispatch_to", "selector")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    DUE_FROM_FIELD_NUMBER: _ClassVar[int]
    DUE_TO_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_FROM_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_TO_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    topic: str
    due_from: _timestamp_pb2.Timestamp
    due_to: _timestamp_pb2.Timestamp
    page_size: int
    page_token: str
    dispatch_from: _timestamp_pb2.Timestamp
    dispatch_to: _timestamp_pb2.Timestamp
    selector: str
    def __init__(self, topic: _Optional[str] = ..., due_from: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., due_to: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., dispatch_from: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., dispatch_to: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., selector: _Optional[str] = ...) -> None: ...

class PendingMessage(_message.Message):
    __slots__ = ("id", "topic", "key", "partition", "deliver_at", "dispatch_at", "scheduled_at", "attempts", "last_error", "value_bytes", "tenant", "labels", "deadline", "dead_letter_topic")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_AT_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_AT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    VALUE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_TOPIC_FIELD_NUMBER: _ClassVar[int]
    id: str
    topic: str
    key: bytes
    partition: int
    deliver_at: _timestamp_pb2.Timestamp
    dispatch_at: _timestamp_pb2.Timestamp
    scheduled_at: _timestamp_pb2.Timestamp
    attempts: int
    last_error: str
    value_bytes: int
    tenant: str
    labels: _containers.ScalarMap[str, str]
    deadline: _timestamp_pb2.Timestamp
    dead_letter_topic: str
    def __init__(self, id: _Optional[str] = ..., topic: _Optional[str] = ..., key: _Optional[bytes] = ..., partition: _Optional[int] = ..., deliver_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., dispatch_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., scheduled_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., attempts: _Optional[int] = ..., last_error: _Optional[str] = ..., value_bytes: _Optional[int] = ..., tenant: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., dead_letter_topic: _Optional[str] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("messages", "next_page_token")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[PendingMessage]
    next_page_token: str
    def __init__(self, messages: _Optional[_Iterable[_Union[PendingMessage, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("as_of", "pending", "delivered", "cancelled", "failed", "dispatching", "oldest_overdue", "store_bytes", "max_pending", "held_back", "expired", "dead_lettered")
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    DISPATCHING_FIELD_NUMBER: _ClassVar[int]
    OLDEST_OVERDUE_FIELD_NUMBER: _ClassVar[int]
    STORE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_PENDING_FIELD_NUMBER: _ClassVar[int]
    HELD_BACK_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    as_of: _timestamp_pb2.Timestamp
    pending: int
    delivered: int
    cancelled: int
    failed: int
    dispatching: int
    oldest_overdue: PendingMessage
    store_bytes: int
    max_pending: int
    held_back: _containers.RepeatedCompositeFieldContainer[HeldBack]
    expired: int
    dead_lettered: int
    def __init__(self, as_of: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pending: _Optional[int] = ..., delivered: _Optional[int] = ..., cancelled: _Optional[int] = ..., failed: _Optional[int] = ..., dispatching: _Optional[int] = ..., oldest_overdue: _Optional[_Union[PendingMessage, _Mapping]] = ..., store_bytes: _Optional[int] = ..., max_pending: _Optional[int] = ..., held_back: _Optional[_Iterable[_Union[HeldBack, _Mapping]]] = ..., expired: _Optional[int] = ..., dead_lettered: _Optional[int] = ...) -> None: ...

class HeldBack(_message.Message):
    __slots__ = ("topic", "tenant", "reason", "since", "oldest_due")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    OLDEST_DUE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    tenant: str
    reason: HeldReason
    since: _timestamp_pb2.Timestamp
    oldest_due: _timestamp_pb2.Timestamp
    def __init__(self, topic: _Optional[str] = ..., tenant: _Optional[str] = ..., reason: _Optional[_Union[HeldReason, str]] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., oldest_due: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CancelMatchingRequest(_message.Message):
    __slots__ = ("selector", "topic", "dispatch_from", "dispatch_to", "page_token")
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_FROM_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_TO_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    selector: str
    topic: str
    dispatch_from: _timestamp_pb2.Timestamp
    dispatch_to: _timestamp_pb2.Timestamp
    page_token: str
    def __init__(self, selector: _Optional[str] = ..., topic: _Optional[str] = ..., dispatch_from: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., dispatch_to: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., page_token: _Optional[str] = ...) -> None: ...

class NotCancelled(_message.Message):
    __slots__ = ("id", "outcome", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: str
    outcome: CancelOutcome
    error: str
    def __init__(self, id: _Optional[str] = ..., outcome: _Optional[_Union[CancelOutcome, str]] = ..., error: _Optional[str] = ...) -> None: ...

class CancelMatchingResponse(_message.Message):
    __slots__ = ("cancelled", "not_cancelled", "next_page_token")
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    NOT_CANCELLED_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    cancelled: int
    not_cancelled: _containers.RepeatedCompositeFieldContainer[NotCancelled]
    next_page_token: str
    def __init__(self, cancelled: _Optional[int] = ..., not_cancelled: _Optional[_Iterable[_Union[NotCancelled, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ForecastRequest(_message.Message):
    __slots__ = ("topic", "to", "interval")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    FROM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    topic: str
    to: _timestamp_pb2.Timestamp
    interval: _duration_pb2.Duration
    def __init__(self, topic: _Optional[str] = ..., to: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., **kwargs) -> None: ...

class ForecastResponse(_message.Message):
    __slots__ = ("to", "interval", "totals", "topics", "counted_to")
    FROM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    COUNTED_TO_FIELD_NUMBER: _ClassVar[int]
    to: _timestamp_pb2.Timestamp
    interval: _duration_pb2.Duration
    totals: _containers.RepeatedScalarFieldContainer[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicForecast]
    counted_to: _timestamp_pb2.Timestamp
    def __init__(self, to: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., totals: _Optional[_Iterable[int]] = ..., topics: _Optional[_Iterable[_Union[TopicForecast, _Mapping]]] = ..., counted_to: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., **kwargs) -> None: ...

class TopicForecast(_message.Message):
    __slots__ = ("topic", "total", "counts")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    total: int
    counts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., total: _Optional[int] = ..., counts: _Optional[_Iterable[int]] = ...) -> None: ...

class SeriesSpec(_message.Message):
    __slots__ = ("template", "cron", "interval", "time_zone", "start", "end", "count", "jitter", "missed", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    CRON_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    TIME_ZONE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    JITTER_FIELD_NUMBER: _ClassVar[int]
    MISSED_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    template: Message
    cron: str
    interval: _duration_pb2.Duration
    time_zone: str
    start: _timestamp_pb2.Timestamp
    end: _timestamp_pb2.Timestamp
    count: int
    jitter: _duration_pb2.Duration
    missed: Missed
    labels: _containers.ScalarMap[str, str]
    def __init__(self, template: _Optional[_Union[Message, _Mapping]] = ..., cron: _Optional[str] = ..., interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., time_zone: _Optional[str] = ..., start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., count: _Optional[int] = ..., jitter: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., missed: _Optional[_Union[Missed, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Missed(_message.Message):
    __slots__ = ("policy", "at_most", "after")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    AT_MOST_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    policy: MissedPolicy
    at_most: int
    after: _duration_pb2.Duration
    def __init__(self, policy: _Optional[_Union[MissedPolicy, str]] = ..., at_most: _Optional[int] = ..., after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class SeriesInfo(_message.Message):
    __slots__ = ("id", "spec", "state", "created_at", "updated_at", "fired", "next", "parked", "skipped", "tenant", "paused_reason")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    FIRED_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    PARKED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PAUSED_REASON_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: SeriesSpec
    state: SeriesState
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    fired: int
    next: _containers.RepeatedCompositeFieldContainer[_timestamp_pb2.Timestamp]
    parked: _containers.RepeatedScalarFieldContainer[str]
    skipped: int
    tenant: str
    paused_reason: str
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[SeriesSpec, _Mapping]] = ..., state: _Optional[_Union[SeriesState, str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., fired: _Optional[int] = ..., next: _Optional[_Iterable[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]]] = ..., parked: _Optional[_Iterable[str]] = ..., skipped: _Optional[int] = ..., tenant: _Optional[str] = ..., paused_reason: _Optional[str] = ...) -> None: ...

class CreateSeriesRequest(_message.Message):
    __slots__ = ("id", "spec")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: SeriesSpec
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[SeriesSpec, _Mapping]] = ...) -> None: ...

class CreateSeriesResponse(_message.Message):
    __slots__ = ("series", "created")
    SERIES_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    series: SeriesInfo
    created: bool
    def __init__(self, series: _Optional[_Union[SeriesInfo, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetSeriesRequest(_message.Message):
    __slots__ = ("id", "next", "tenant")
    ID_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    id: str
    next: int
    tenant: str
    def __init__(self, id: _Optional[str] = ..., next: _Optional[int] = ..., tenant: _Optional[str] = ...) -> None: ...

class ListSeriesRequest(_message.Message):
    __slots__ = ("topic", "selector", "page_size", "page_token")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    topic: str
    selector: str
    page_size: int
    page_token: str
    def __init__(self, topic: _Optional[str] = ..., selector: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSeriesResponse(_message.Message):
    __slots__ = ("series", "next_page_token")
    SERIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    series: _containers.RepeatedCompositeFieldContainer[SeriesInfo]
    next_page_token: str
    def __init__(self, series: _Optional[_Iterable[_Union[SeriesInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class OccurrenceOutcome(_message.Message):
    __slots__ = ("id", "outcome")
    ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    id: str
    outcome: CancelOutcome
    def __init__(self, id: _Optional[str] = ..., outcome: _Optional[_Union[CancelOutcome, str]] = ...) -> None: ...

class UpdateSeriesRequest(_message.Message):
    __slots__ = ("id", "spec")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: SeriesSpec
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[SeriesSpec, _Mapping]] = ...) -> None: ...

class UpdateSeriesResponse(_message.Message):
    __slots__ = ("series", "occurrences")
    SERIES_FIELD_NUMBER: _ClassVar[int]
    OCCURRENCES_FIELD_NUMBER: _ClassVar[int]
    series: SeriesInfo
    occurrences: _containers.RepeatedCompositeFieldContainer[OccurrenceOutcome]
    def __init__(self, series: _Optional[_Union[SeriesInfo, _Mapping]] = ..., occurrences: _Optional[_Iterable[_Union[OccurrenceOutcome, _Mapping]]] = ...) -> None: ...

class PauseSeriesRequest(_message.Message):
    __slots__ = ("id", "tenant")
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant: str
    def __init__(self, id: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class PauseSeriesResponse(_message.Message):
    __slots__ = ("series", "occurrences")
    SERIES_FIELD_NUMBER: _ClassVar[int]
    OCCURRENCES_FIELD_NUMBER: _ClassVar[int]
    series: SeriesInfo
    occurrences: _containers.RepeatedCompositeFieldContainer[OccurrenceOutcome]
    def __init__(self, series: _Optional[_Union[SeriesInfo, _Mapping]] = ..., occurrences: _Optional[_Iterable[_Union[OccurrenceOutcome, _Mapping]]] = ...) -> None: ...

class ResumeSeriesRequest(_message.Message):
    __slots__ = ("id", "tenant")
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant: str
    def __init__(self, id: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class DeleteSeriesRequest(_message.Message):
    __slots__ = ("id", "tenant")
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant: str
    def __init__(self, id: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class DeleteSeriesResponse(_message.Message):
    __slots__ = ("occurrences",)
    OCCURRENCES_FIELD_NUMBER: _ClassVar[int]
    occurrences: _containers.RepeatedCompositeFieldContainer[OccurrenceOutcome]
    def __init__(self, occurrences: _Optional[_Iterable[_Union[OccurrenceOutcome, _Mapping]]] = ...) -> None: ...

class BackupRequest(_message.Message):
    __slots__ = ("dir",)
    DIR_FIELD_NUMBER: _ClassVar[int]
    dir: str
    def __init__(self, dir: _Optional[str] = ...) -> None: ...

class BackupResponse(_message.Message):
    __slots__ = ("dir", "shards", "pending", "taken_at")
    DIR_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    TAKEN_AT_FIELD_NUMBER: _ClassVar[int]
    dir: str
    shards: int
    pending: int
    taken_at: _timestamp_pb2.Timestamp
    def __init__(self, dir: _Optional[str] = ..., shards: _Optional[int] = ..., pending: _Optional[int] = ..., taken_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class TopicPolicyRequest(_message.Message):
    __slots__ = ("topic", "all_tenants", "tenant")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ALL_TENANTS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    all_tenants: bool
    tenant: str
    def __init__(self, topic: _Optional[str] = ..., all_tenants: _Optional[bool] = ..., tenant: _Optional[str] = ...) -> None: ...

class SetRateLimitRequest(_message.Message):
    __slots__ = ("topic", "all_tenants", "per_second", "burst", "tenant")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ALL_TENANTS_FIELD_NUMBER: _ClassVar[int]
    PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    all_tenants: bool
    per_second: int
    burst: int
    tenant: str
    def __init__(self, topic: _Optional[str] = ..., all_tenants: _Optional[bool] = ..., per_second: _Optional[int] = ..., burst: _Optional[int] = ..., tenant: _Optional[str] = ...) -> None: ...

class SetMaxLatenessRequest(_message.Message):
    __slots__ = ("topic", "all_tenants", "max_lateness", "tenant")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ALL_TENANTS_FIELD_NUMBER: _ClassVar[int]
    MAX_LATENESS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    all_tenants: bool
    max_lateness: _duration_pb2.Duration
    tenant: str
    def __init__(self, topic: _Optional[str] = ..., all_tenants: _Optional[bool] = ..., max_lateness: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., tenant: _Optional[str] = ...) -> None: ...

class SetDeadLetterTopicRequest(_message.Message):
    __slots__ = ("topic", "all_tenants", "dead_letter_topic", "tenant")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ALL_TENANTS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_TOPIC_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    all_tenants: bool
    dead_letter_topic: str
    tenant: str
    def __init__(self, topic: _Optional[str] = ..., all_tenants: _Optional[bool] = ..., dead_letter_topic: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class RateLimit(_message.Message):
    __slots__ = ("per_second", "burst")
    PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    per_second: int
    burst: int
    def __init__(self, per_second: _Optional[int] = ..., burst: _Optional[int] = ...) -> None: ...

class TopicPolicy(_message.Message):
    __slots__ = ("topic", "tenant", "paused", "paused_at", "rate_limit", "updated_at", "updated_by", "max_lateness", "dead_letter_topic")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    PAUSED_AT_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_BY_FIELD_NUMBER: _ClassVar[int]
    MAX_LATENESS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    tenant: str
    paused: bool
    paused_at: _timestamp_pb2.Timestamp
    rate_limit: RateLimit
    updated_at: _timestamp_pb2.Timestamp
    updated_by: str
    max_lateness: _duration_pb2.Duration
    dead_letter_topic: str
    def __init__(self, topic: _Optional[str] = ..., tenant: _Optional[str] = ..., paused: _Optional[bool] = ..., paused_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., rate_limit: _Optional[_Union[RateLimit, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_by: _Optional[str] = ..., max_lateness: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., dead_letter_topic: _Optional[str] = ...) -> None: ...

class DescribeClusterRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeClusterResponse(_message.Message):
    __slots__ = ("cluster", "shards", "nodes", "unanswered")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    UNANSWERED_FIELD_NUMBER: _ClassVar[int]
    cluster: bool
    shards: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    unanswered: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cluster: _Optional[bool] = ..., shards: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., unanswered: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("addr", "as_of", "copies", "moves")
    ADDR_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    MOVES_FIELD_NUMBER: _ClassVar[int]
    addr: str
    as_of: _timestamp_pb2.Timestamp
    copies: _containers.RepeatedCompositeFieldContainer[ShardCopy]
    moves: _containers.RepeatedCompositeFieldContainer[ShardMove]
    def __init__(self, addr: _Optional[str] = ..., as_of: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., copies: _Optional[_Iterable[_Union[ShardCopy, _Mapping]]] = ..., moves: _Optional[_Iterable[_Union[ShardMove, _Mapping]]] = ...) -> None: ...

class ShardCopy(_message.Message):
    __slots__ = ("shard", "role", "pending", "applied", "log_end")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    LOG_END_FIELD_NUMBER: _ClassVar[int]
    shard: int
    role: CopyRole
    pending: int
    applied: int
    log_end: int
    def __init__(self, shard: _Optional[int] = ..., role: _Optional[_Union[CopyRole, str]] = ..., pending: _Optional[int] = ..., applied: _Optional[int] = ..., log_end: _Optional[int] = ...) -> None: ...

class ShardMove(_message.Message):
    __slots__ = ("at", "shard", "what")
    AT_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    WHAT_FIELD_NUMBER: _ClassVar[int]
    at: _timestamp_pb2.Timestamp
    shard: int
    what: str
    def __init__(self, at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., shard: _Optional[int] = ..., what: _Optional[str] = ...) -> None: ...

class ListTopicPoliciesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTopicPoliciesResponse(_message.Message):
    __slots__ = ("policies",)
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    policies: _containers.RepeatedCompositeFieldContainer[TopicPolicy]
    def __init__(self, policies: _Optional[_Iterable[_Union[TopicPolicy, _Mapping]]] = ...) -> None: ...

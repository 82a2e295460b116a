from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StatusCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EOK: _ClassVar[StatusCode]
    ENOLEDGER: _ClassVar[StatusCode]
    ENOENTRY: _ClassVar[StatusCode]
    EBADREQ: _ClassVar[StatusCode]
    EIO: _ClassVar[StatusCode]
    EUA: _ClassVar[StatusCode]
    EBADVERSION: _ClassVar[StatusCode]
    EFENCED: _ClassVar[StatusCode]
    EREADONLY: _ClassVar[StatusCode]
    ETOOMANYREQUESTS: _ClassVar[StatusCode]
    EUNKNOWNLEDGERSTATE: _ClassVar[StatusCode]
EOK: StatusCode
ENOLEDGER: StatusCode
ENOENTRY: StatusCode
EBADREQ: StatusCode
EIO: StatusCode
EUA: StatusCode
EBADVERSION: StatusCode
EFENCED: StatusCode
EREADONLY: StatusCode
ETOOMANYREQUESTS: StatusCode
EUNKNOWNLEDGERSTATE: StatusCode

class AddRequest(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "master_key", "flags", "body", "request_id")
    class Flag(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        NONE: _ClassVar[AddRequest.Flag]
        RECOVERY_ADD: _ClassVar[AddRequest.Flag]
    NONE: AddRequest.Flag
    RECOVERY_ADD: AddRequest.Flag
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    master_key: bytes
    flags: int
    body: bytes
    request_id: int
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., master_key: _Optional[bytes] = ..., flags: _Optional[int] = ..., body: _Optional[bytes] = ..., request_id: _Optional[int] = ...) -> None: ...

class AddResponse(_message.Message):
    __slots__ = ("status", "ledger_id", "entry_id", "request_id", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    ledger_id: int
    entry_id: int
    request_id: int
    message: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., request_id: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class AddBatch(_message.Message):
    __slots__ = ("adds", "trace")
    ADDS_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    adds: _containers.RepeatedCompositeFieldContainer[AddRequest]
    trace: bool
    def __init__(self, adds: _Optional[_Iterable[_Union[AddRequest, _Mapping]]] = ..., trace: _Optional[bool] = ...) -> None: ...

class AddBatchResponse(_message.Message):
    __slots__ = ("responses", "trace_received_ns", "trace_stored_ns")
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    TRACE_RECEIVED_NS_FIELD_NUMBER: _ClassVar[int]
    TRACE_STORED_NS_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[AddResponse]
    trace_received_ns: int
    trace_stored_ns: int
    def __init__(self, responses: _Optional[_Iterable[_Union[AddResponse, _Mapping]]] = ..., trace_received_ns: _Optional[int] = ..., trace_stored_ns: _Optional[int] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("ledger_id", "entry_id", "flags", "master_key", "has_previous_lac", "previous_lac", "timeout_ms")
    class Flag(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        NONE: _ClassVar[ReadRequest.Flag]
        FENCE_LEDGER: _ClassVar[ReadRequest.Flag]
        ENTRY_PIGGYBACK: _ClassVar[ReadRequest.Flag]
    NONE: ReadRequest.Flag
    FENCE_LEDGER: ReadRequest.Flag
    ENTRY_PIGGYBACK: ReadRequest.Flag
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    HAS_PREVIOUS_LAC_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_LAC_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    entry_id: int
    flags: int
    master_key: bytes
    has_previous_lac: bool
    previous_lac: int
    timeout_ms: int
    def __init__(self, ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., flags: _Optional[int] = ..., master_key: _Optional[bytes] = ..., has_previous_lac: _Optional[bool] = ..., previous_lac: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("status", "ledger_id", "entry_id", "body", "max_lac", "message", "lac_body")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    MAX_LAC_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LAC_BODY_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    ledger_id: int
    entry_id: int
    body: bytes
    max_lac: int
    message: str
    lac_body: bytes
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., body: _Optional[bytes] = ..., max_lac: _Optional[int] = ..., message: _Optional[str] = ..., lac_body: _Optional[bytes] = ...) -> None: ...

class ReadRangeRequest(_message.Message):
    __slots__ = ("ledger_id", "first_entry_id", "last_entry_id", "max_bytes_per_message", "step", "more")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_PER_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    max_bytes_per_message: int
    step: int
    more: bool
    def __init__(self, ledger_id: _Optional[int] = ..., first_entry_id: _Optional[int] = ..., last_entry_id: _Optional[int] = ..., max_bytes_per_message: _Optional[int] = ..., step: _Optional[int] = ..., more: _Optional[bool] = ...) -> None: ...

class EntryBody(_message.Message):
    __slots__ = ("entry_id", "body")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    entry_id: int
    body: bytes
    def __init__(self, entry_id: _Optional[int] = ..., body: _Optional[bytes] = ...) -> None: ...

class ReadRangeResponse(_message.Message):
    __slots__ = ("status", "entries", "next_entry_id", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    entries: _containers.RepeatedCompositeFieldContainer[EntryBody]
    next_entry_id: int
    message: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., entries: _Optional[_Iterable[_Union[EntryBody, _Mapping]]] = ..., next_entry_id: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ReadLacRequest(_message.Message):
    __slots__ = ("ledger_id",)
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    def __init__(self, ledger_id: _Optional[int] = ...) -> None: ...

class ReadLacResponse(_message.Message):
    __slots__ = ("status", "ledger_id", "lac_body", "last_entry_body", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    LAC_BODY_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_BODY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    ledger_id: int
    lac_body: bytes
    last_entry_body: bytes
    message: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., ledger_id: _Optional[int] = ..., lac_body: _Optional[bytes] = ..., last_entry_body: _Optional[bytes] = ..., message: _Optional[str] = ...) -> None: ...

class WriteLacRequest(_message.Message):
    __slots__ = ("ledger_id", "lac", "master_key", "lac_body")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    LAC_BODY_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    lac: int
    master_key: bytes
    lac_body: bytes
    def __init__(self, ledger_id: _Optional[int] = ..., lac: _Optional[int] = ..., master_key: _Optional[bytes] = ..., lac_body: _Optional[bytes] = ...) -> None: ...

class WriteLacResponse(_message.Message):
    __slots__ = ("status", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    message: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., message: _Optional[str] = ...) -> None: ...

class BookieInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BookieInfoResponse(_message.Message):
    __slots__ = ("status", "bookie_id", "total_disk_bytes", "free_disk_bytes", "read_only", "data_port")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    BOOKIE_ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    DATA_PORT_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    bookie_id: str
    total_disk_bytes: int
    free_disk_bytes: int
    read_only: bool
    data_port: int
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., bookie_id: _Optional[str] = ..., total_disk_bytes: _Optional[int] = ..., free_disk_bytes: _Optional[int] = ..., read_only: _Optional[bool] = ..., data_port: _Optional[int] = ...) -> None: ...

class ListEntriesRequest(_message.Message):
    __slots__ = ("ledger_id",)
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    def __init__(self, ledger_id: _Optional[int] = ...) -> None: ...

class EntryRange(_message.Message):
    __slots__ = ("first", "last")
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    first: int
    last: int
    def __init__(self, first: _Optional[int] = ..., last: _Optional[int] = ...) -> None: ...

class ListEntriesResponse(_message.Message):
    __slots__ = ("status", "ranges", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    ranges: _containers.RepeatedCompositeFieldContainer[EntryRange]
    message: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., ranges: _Optional[_Iterable[_Union[EntryRange, _Mapping]]] = ..., message: _Optional[str] = ...) -> None: ...

class ForceRequest(_message.Message):
    __slots__ = ("ledger_id",)
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    def __init__(self, ledger_id: _Optional[int] = ...) -> None: ...

class ForceResponse(_message.Message):
    __slots__ = ("status", "message")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    message: str
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., message: _Optional[str] = ...) -> None: ...

class FaultRule(_message.Message):
    __slots__ = ("op", "action", "delay_ms", "error", "ledger_id", "entry_id", "probability", "count", "match_entry")
    OP_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MATCH_ENTRY_FIELD_NUMBER: _ClassVar[int]
    op: str
    action: str
    delay_ms: int
    error: StatusCode
    ledger_id: int
    entry_id: int
    probability: float
    count: int
    match_entry: bool
    def __init__(self, op: _Optional[str] = ..., action: _Optional[str] = ..., delay_ms: _Optional[int] = ..., error: _Optional[_Union[StatusCode, str]] = ..., ledger_id: _Optional[int] = ..., entry_id: _Optional[int] = ..., probability: _Optional[float] = ..., count: _Optional[int] = ..., match_entry: _Optional[bool] = ...) -> None: ...

class SetFaultsRequest(_message.Message):
    __slots__ = ("rules",)
    RULES_FIELD_NUMBER: _ClassVar[int]
    rules: _containers.RepeatedCompositeFieldContainer[FaultRule]
    def __init__(self, rules: _Optional[_Iterable[_Union[FaultRule, _Mapping]]] = ...) -> None: ...

class SetFaultsResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ...) -> None: ...

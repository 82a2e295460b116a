"""Data-port add streams: an idle stream sends from the appender's thread without ever
blocking it; what the socket did not take goes out first from the sender thread, so frames
stay whole; while a message is unanswered the next one is held until the ack (or
``max_linger``) and then carries everything held. The "bookie" is the far end of a socket
pair that reads only when told to."""
import socket
import threading
import time

from bkspark.client import bookie_client as bc
from bkspark.proto import wire


class _PairClient(bc.BookieClient):
    def __init__(self):
        super().__init__("pair:1", "127.0.0.1:1", {})
        self.near, self.far = socket.socketpair()

    def _open_add_transport(self, stream):
        stream.linger = 0.0
        stream.opened(lambda: wire.shutdown(self.near))
        return self._data_port_responses(self.near, stream)


def _open_stream(max_linger=None):
    """A client whose add stream is open on the socket pair (it opens in the stream's thread)."""
    client = _PairClient()
    if max_linger is not None:
        client.max_linger = max_linger
    stream = client._stream = bc._AddStream(client)
    while stream._direct is None:
        threading.Event().wait(0.01)
    return client, stream


def _read_frames(sock, nbytes):
    data = b""
    while len(data) < nbytes:
        more = sock.recv(1 << 20)
        assert more, "the stream ended early"
        data += more
    frames, pos = [], 0
    while pos < len(data):
        size, kind = wire.FRAME.unpack_from(data, pos)
        frames.append((kind, data[pos + wire.FRAME.size:pos + wire.FRAME.size + size]))
        pos += wire.FRAME.size + size
    return frames


def test_a_stalled_peer_never_blocks_the_appender_and_frames_stay_whole():
    client, stream = _open_stream()
    elems = [bytes([i]) * (3 << 20) for i in range(4)]    # each larger than socket buffers
    done = threading.Event()

    def appender():
        for e in elems:
            assert stream.send([e])
        done.set()

    threading.Thread(target=appender, daemon=True).start()
    assert done.wait(30), "send() blocked on a peer that does not read"
    frames = _read_frames(client.far, sum(len(e) + wire.FRAME.size for e in elems))
    assert [k for k, _ in frames] == [wire.KIND_ADD_BATCH] * len(frames)
    assert b"".join(p for _, p in frames) == b"".join(elems)       # whole, in order
    assert stream.sent_elements == len(elems) and stream.partial is None
    client.close()


def test_an_idle_stream_sends_from_the_caller_and_a_busy_one_holds_until_the_ack():
    client, stream = _open_stream()
    stream.send([b"one"])                   # idle: sent at once by this thread
    assert stream.held == [] and stream.sent_elements == 1
    stream.send([b"two"])                   # "one" unanswered: held
    stream.send([b"three"])
    assert stream.held == [b"two", b"three"] and stream.sent_elements == 1
    stream.acked_elements += 1              # what the reader does with an ack ...
    with stream.lock:
        stream._pump_locked()               # ... and then it sends what is held, at once
    assert stream.held == [] and stream.sent_elements == 3
    frames = _read_frames(client.far, 2 * wire.FRAME.size + 11)
    assert [p for _, p in frames] == [b"one", b"twothree"]
    assert (client.add_messages, client.add_elements) == (2, 3)
    client.close()


def test_an_unanswered_message_holds_the_next_one_only_max_linger():
    """A dropped add is never answered: the sender thread sends what is held anyway."""
    client, stream = _open_stream(max_linger=0.05)
    stream.send([b"a"])
    stream.send([b"b"])
    frames = _read_frames(client.far, 2 * wire.FRAME.size + 2)
    assert [p for _, p in frames] == [b"a", b"b"]
    stream.send([b"c"])
    frames = _read_frames(client.far, wire.FRAME.size + 1)
    assert [p for _, p in frames] == [b"c"]
    assert stream.acked_elements == 0 and stream.sent_elements == 3
    client.close()


def test_close_sends_what_is_held_then_ends_the_request_side():
    client, stream = _open_stream()
    stream.send([b"1"])
    stream.send([b"2"])                     # held: "1" is unanswered
    stream.close()
    frames = _read_frames(client.far, 2 * wire.FRAME.size + 2)
    assert [p for _, p in frames] == [b"1", b"2"]
    client.far.settimeout(10)
    assert client.far.recv(1) == b""        # SHUT_WR: the bookie sees the end
    client.close()


class _Sink:
    def __init__(self):
        self.failed = threading.Event()
        self.errors = []

    def on_bookie_failed(self, bookie_id, error):
        self.errors.append(error)
        self.failed.set()


def test_a_backlog_over_the_bound_holds_the_appender_then_breaks_the_stream():
    """A peer that reads nothing: once more than ``max_backlog`` bytes wait unsent, the
    appender waits (back-pressure) and after ``backlog_wait`` the stream is broken (its sinks
    hear it); what comes after is dropped, not held: the client's memory for a stuck bookie
    is bounded whatever the writer's rate."""
    client, stream = _open_stream()
    sink = _Sink()
    client.sinks[7] = sink
    client.max_backlog, client.backlog_wait = 8 << 20, 0.5
    t0 = time.monotonic()
    for i in range(64):                              # 64 x 1 MiB at a peer that reads nothing
        client.send_adds([bytes([i]) * (1 << 20)])
        if stream.cancelled:
            break
    assert stream.cancelled, "64 MiB queued for a peer that reads nothing"
    assert 0.5 <= time.monotonic() - t0 < 5
    assert sink.failed.wait(10), "the broken stream's sinks never heard of it"
    held = stream.backlog
    assert not stream.send([b"x" * (1 << 20)])
    assert stream.backlog == held <= (8 << 20) + (2 << 20)
    client.close()


def test_a_burst_over_the_bound_to_a_reading_peer_waits_and_breaks_nothing():
    """One call larger than ``max_backlog`` to a bookie that takes it: the appender waits
    while it drains; the stream stays (before, a burst broke healthy bookies, and the
    ensemble change then broke their replacements the same way)."""
    client, stream = _open_stream()
    client.max_backlog, client.backlog_wait = 1 << 20, 30
    got = []

    def bookie():
        while sum(got) < 24 << 20:
            got.append(len(client.far.recv(1 << 20)))

    reader = threading.Thread(target=bookie, daemon=True)
    reader.start()
    for i in range(3):
        client.send_adds([bytes([i]) * (1 << 20)] * 8)           # 8 MiB a call
        assert not stream.cancelled and stream.backlog <= 1 << 20
    reader.join(30)
    assert sum(got) >= 24 << 20 and not stream.cancelled
    client.close()


def test_a_stream_broken_while_opening_is_reported_at_once():
    """A stopped bookie leaves the stream's opening waiting up to ``DATA_CONNECT_TIMEOUT``;
    breaking it reports the bookie failed now (so the ledger replaces it now), once."""
    release = threading.Event()

    class _Hanging(bc.BookieClient):
        def _open_add_transport(self, stream):
            release.wait(30)
            raise OSError("the opening gave up")

    client = _Hanging("hang:1", "127.0.0.1:1", {})
    sink = _Sink()
    client.sinks[7] = sink
    client.send_adds([b"a" * 100])
    client.break_stream("test: stuck")
    assert sink.failed.wait(5), "the broken stream was reported only when its opening ended"
    assert "stuck" in str(sink.errors[0])
    release.set()
    threading.Event().wait(0.3)
    assert len(sink.errors) == 1, sink.errors
    client.close()

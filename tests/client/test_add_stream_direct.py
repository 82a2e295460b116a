"""Data-port add streams: an idle stream sends from the appender's thread without ever
blocking it; what the socket did not take goes out first from the sender thread, so frames
stay whole. The "bookie" is the far end of a socket pair that reads only when told to."""
import socket
import threading

from bkspark.client import bookie_client as bc
from bkspark.client import wire


class _PairClient(bc.BookieClient):
    def __init__(self):
        super().__init__("pair:1", "127.0.0.1:1", {})
        self.near, self.far = socket.socketpair()

    def _open_add_transport(self, stream):
        stream.linger = 0.0
        stream.opened(lambda: wire.shutdown(self.near))
        return self._data_port_responses(self.near, stream)


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
    client = _PairClient()
    stream = client._stream = bc._AddStream(client)
    while stream._direct is None:           # the transport opens in the stream's thread
        threading.Event().wait(0.01)
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


def test_an_idle_stream_sends_from_the_caller_and_a_busy_one_queues():
    client = _PairClient()
    stream = client._stream = bc._AddStream(client)
    while stream._direct is None:
        threading.Event().wait(0.01)
    stream.send([b"one"])                   # idle: sent at once by this thread
    assert stream.q.empty() and stream.sent_elements == 1
    stream.send([b"two"])                   # "one" unanswered: queued for the sender thread
    frames = _read_frames(client.far, 2 * wire.FRAME.size + 6)
    assert [p for _, p in frames] == [b"one", b"two"]
    assert stream.sent_elements == 2
    client.close()

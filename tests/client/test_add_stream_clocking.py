"""The add stream's request generator (gRPC, or a data port with a linger): coalescing and
self-clocking (no transport, no bookie).

A fake call consumes the generator like gRPC does; the test plays the bookie by counting
elements as answered. Nothing here asserts how long anything took.
"""
import queue
import threading

from bkspark.client import bookie_client as bc


class _FakeCall:
    def __init__(self, requests):
        self.messages = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._consume, args=(requests,), daemon=True)
        self.thread.start()

    def _consume(self, requests):
        for m in requests:
            self.messages.put(m)

    def cancel(self):
        pass

    def __iter__(self):        # the ack reader: no acks from this fake
        return iter(())


class _FakeClient:
    def __init__(self, linger, max_linger):
        self.bookie_id = "fake:1"
        self.linger, self.max_linger = linger, max_linger
        self.sinks = {}
        self.add_messages = self.add_elements = self.ack_messages = 0
        self.trace = None                   # (no add trace)
        self.calls = []

    def _open_add_transport(self, stream):
        stream.use_queue()                  # a generator transport, like gRPC's
        call = _FakeCall(bc._joined(stream._requests()))
        self.calls.append(call)
        stream.opened(call.cancel)
        return call

    def _stream_died(self, stream, error):
        pass


def _stream(linger=0.0, max_linger=60.0):
    client = _FakeClient(linger, max_linger)
    st = bc._AddStream(client)
    st.thread.join(5)          # the fake ack reader ends at once
    return client, st, client.calls[0].messages


def _answer(st, n):
    st.acked_elements += n
    st.answered.set()


def test_next_message_waits_for_the_answer_and_carries_everything_queued_meanwhile():
    client, st, msgs = _stream()
    st.send([b"a"])
    assert msgs.get(timeout=5) == b"a"          # nothing in flight: sent at once
    st.send([b"b"])
    st.send([b"c", b"d"])
    try:
        msgs.get(timeout=0.3)
        raise AssertionError("a message went out while the previous one was unanswered")
    except queue.Empty:
        pass
    _answer(st, 1)
    assert msgs.get(timeout=5) == b"bcd"
    _answer(st, 3)
    st.send([b"e"])
    assert msgs.get(timeout=5) == b"e"
    assert (client.add_messages, client.add_elements) == (3, 5)
    assert st.sent_elements == 5
    st.close()


def test_unanswered_elements_do_not_stall_the_stream():
    """Dropped adds are never answered: after max_linger the next message goes anyway."""
    client, st, msgs = _stream(max_linger=0.05)
    st.send([b"x"])
    assert msgs.get(timeout=5) == b"x"
    st.send([b"y"])
    assert msgs.get(timeout=5) == b"y"
    st.send([b"z"])
    assert msgs.get(timeout=5) == b"z"
    assert st.acked_elements == 0 and st.sent_elements == 3
    st.close()


def test_close_ends_the_generator_after_sending_what_is_queued():
    client, st, msgs = _stream()
    st.send([b"1"])
    assert msgs.get(timeout=5) == b"1"
    _answer(st, 1)
    st.send([b"2"])
    st.close()
    client.calls[0].thread.join(5)
    assert not client.calls[0].thread.is_alive()
    assert msgs.get(timeout=5) == b"2"

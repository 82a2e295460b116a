"""Arrow entries: an entry is one Arrow IPC record batch message (no schema: a ledger keeps
its schema once, in its metadata -- :func:`bkspark.spark.codec.arrow_ledger_metadata`), its
body buffers optionally compressed (LZ4 frame or ZSTD, Arrow's own IPC body compression: the
message says which, so readers need no option). The log layer's, as the record format is
(:mod:`bkspark.log.records`): the Spark connector writes such entries, and a log's offloaded
rows turn back into them (:mod:`bkspark.log.offload`). For one pyarrow version, encoding the
same rows with the same compression gives the same bytes -- if they are in fresh buffers
(:func:`fresh`): a slice serializes otherwise.
"""
from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa

_I32 = struct.Struct("<i")

#: IPC write options per body codec; one thread: each Spark task already has its core
_IPC_OPTIONS = {name: pa.ipc.IpcWriteOptions(compression=name, use_threads=False)
                for name in ("lz4", "zstd")}


def encode_arrow(batch: pa.RecordBatch, compression: str | None = None):
    """The entry of one record batch: its IPC message (a pyarrow Buffer), its body buffers
    compressed with ``compression`` (``"lz4"`` | ``"zstd"`` | None)."""
    if compression is None:
        return batch.serialize()
    # pyarrow serializes a compressed message only through a stream writer: write the
    # schema message and this one, and keep the second (zero-copy slice). An encapsulated
    # schema message is 0xFFFFFFFF, int32 metadata length, metadata, no body.
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=_IPC_OPTIONS[compression]) as writer:
        writer.write_batch(batch)
    stream = sink.getvalue()
    start = 8 + _I32.unpack_from(stream, 4)[0]
    return stream.slice(start, stream.size - start - 8)       # the last 8 bytes: end of stream


def fresh(parts) -> pa.RecordBatch:
    """The rows of the batches ``parts`` (slices of others, maybe) as one batch in fresh
    buffers of their exact sizes: the one form :func:`encode_arrow` gives the same bytes of
    whatever batches the rows came in (a writer's split, a file's row groups)."""
    t = pa.Table.from_batches(parts)
    return t.take(pa.array(np.arange(t.num_rows))).combine_chunks().to_batches()[0]

"""Keeping the cyclic garbage collector's full collections off the latency path."""
from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Move every object alive now out of the cyclic collector's reach (``gc.freeze``).

    Call once a long-lived process has started (modules, gRPC, the client or bookie built).
    A full collection of a client's start-up heap (~30k objects: gRPC, protobuf, this package)
    took 10-13 ms here, and every thread of the process stops for it: it was the largest
    single stall in a paced add run (the 20 slowest 200-ms windows of ``bench/client.py``'s
    half-peak run started with one). Frozen objects are still freed by reference counting;
    only a cycle among them that dies later is never collected, which for start-up state
    (modules, classes, singletons) does not happen.
    """
    gc.collect()
    gc.freeze()

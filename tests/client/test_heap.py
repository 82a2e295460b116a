"""freeze_startup_heap: what is alive at start-up leaves the cyclic collector; later garbage
cycles are still collected."""
import gc
import weakref

from bkspark.heap import freeze_startup_heap


class _Node:
    pass


def test_startup_heap_is_frozen_and_later_cycles_are_still_collected():
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() > 1000        # modules, classes, functions of this process
        node = _Node()
        node.self = node                            # a cycle created after the freeze
        ref = weakref.ref(node)
        del node
        gc.collect()
        assert ref() is None
    finally:
        gc.unfreeze()

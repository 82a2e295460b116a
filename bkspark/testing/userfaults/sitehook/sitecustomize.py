"""Put first on the PYTHONPATH of a user-level fault run's Spark drivers (and so of their
Python workers): lets those workers claim the run's arm files (lost metadata answers, session
expiry) in the process that runs the connector's commit or planning. Does nothing unless
``BKSPARK_UF_ARM_DIR`` is set. See :mod:`bkspark.testing.userfaults.workloads`.

The patch is applied when the connector's package ``bkspark.spark`` is first imported (in a
worker: when it unpickles the data source), not when the worker starts: Spark gives a new
Python worker 10 s to connect back (not configurable), and importing the connector at start
took most of that on two busy cores -- the streaming source's runner then failed to start."""
import os
import sys

PACKAGE = "bkspark.spark"


class _PatchAfterImport:
    """A meta path finder that finds nothing itself: it wraps the loader of :data:`PACKAGE`
    so that the patch runs right after the package's own code, and leaves ``sys.meta_path``
    once the package has been loaded (a lookup alone, ``importlib.util.find_spec``, does not
    end it)."""

    def __init__(self):
        self._finding = False

    def find_spec(self, name, path=None, target=None):
        if name != PACKAGE or self._finding:
            return None
        import importlib.util
        self._finding = True            # (the lookup below asks every finder, this one too)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._finding = False
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            try:
                from bkspark.testing.userfaults.workloads import patch_spark_conn
                patch_spark_conn()
            except Exception:  # noqa: BLE001 - a worker must run even if the hook cannot
                pass
        spec.loader.exec_module = exec_then_patch
        return spec


if os.environ.get("BKSPARK_UF_ARM_DIR") and PACKAGE not in sys.modules:
    sys.meta_path.insert(0, _PatchAfterImport())

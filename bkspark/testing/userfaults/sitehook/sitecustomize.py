"""Put first on the PYTHONPATH of a user-level fault run's Spark drivers (and so of their
Python workers): lets those workers claim the run's arm files (lost metadata answers, session
expiry) in the process that runs the connector's commit or planning. Does nothing unless
``BKSPARK_UF_ARM_DIR`` is set. See :mod:`bkspark.testing.userfaults.workloads`."""
import os

if os.environ.get("BKSPARK_UF_ARM_DIR"):
    try:
        from bkspark.testing.userfaults.workloads import patch_spark_conn
        patch_spark_conn()
    except Exception:  # noqa: BLE001 - a worker must start even if the hook cannot
        pass

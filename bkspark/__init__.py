"""bkspark: a BookKeeper-style replicated log store with a PySpark data source.

Subpackages: ``client`` (ledgers), ``bookie`` (storage server), ``log`` (logs, cursors,
checkpoint store), ``spark`` (the ``bookkeeper`` data source), ``recovery`` (autorecovery),
``cli`` (the ``bkspark`` command). Metadata stores live in the top-level ``metadata`` package.
"""
__version__ = "0.1.0"

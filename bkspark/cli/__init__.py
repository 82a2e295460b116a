"""The ``bkspark`` command: bookie launcher, local cluster, shell, autorecovery."""

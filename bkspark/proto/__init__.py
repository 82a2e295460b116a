"""The bookie wire protocol: ``bookie.proto`` and its generated modules (``make proto``)."""

"""The bookie: storage server of bkspark (gRPC service, storage engine wrapper, GC, admin)."""

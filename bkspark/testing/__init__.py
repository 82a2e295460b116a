"""Test tooling shipped with bkspark: bookie clusters with fault injection (like kazoo.testing)."""

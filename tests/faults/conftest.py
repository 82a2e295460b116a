"""Fault campaigns (issue 9): bounded CI runs. Seeds come from BKSPARK_FAULTS_SEED when set
(replay a failure with the seed the failing test printed)."""
import os

import pytest


@pytest.fixture
def faults_seed() -> int:
    return int(os.environ.get("BKSPARK_FAULTS_SEED", "20261121"))

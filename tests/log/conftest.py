"""Logs tests run against three real bookies on an embedded metadata store."""
import pytest

from bkspark.client import BookKeeper
from bkspark.log import LogStore
from bkspark.testing.cluster import BookieCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    data = tmp_path_factory.mktemp("log-cluster")
    with BookieCluster(f"sqlite:///{data}/meta.db", num_bookies=3, data_dir=data) as c:
        yield c


@pytest.fixture
def bk(cluster):
    with BookKeeper(cluster.metadata_uri) as client:
        yield client


@pytest.fixture
def logs(bk):
    return LogStore(bk, password=b"pw", ensemble_size=3, write_quorum=2, ack_quorum=2)


@pytest.fixture
def log_name(request):
    return "log-" + request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:150]

"""Logs tests run against three real bookies, on the embedded store and on real ZooKeeper."""
import pytest

from metadata.testing import unique_root

from bkspark.client import BookKeeper
from bkspark.log import LogStore
from bkspark.testing.cluster import BookieCluster


@pytest.fixture(scope="module", params=["sqlite", "zk"])
def cluster(request, tmp_path_factory):
    data = tmp_path_factory.mktemp("log-cluster")
    if request.param == "zk":
        uri = request.getfixturevalue("zookeeper").uri(unique_root())
    else:
        uri = f"sqlite:///{data}/meta.db"
    with BookieCluster(uri, num_bookies=3, data_dir=data) as c:
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

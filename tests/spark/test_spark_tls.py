"""format("bookkeeper") against bookies that serve TLS only: the ``client.*`` options reach
every client the connector makes (driver and executors), in local[2]."""
import time

import pytest

from bkspark.client import BookKeeper
from bkspark.localcluster import LocalCluster
from bkspark.log import LogStore
from bkspark.testing.tls import self_signed, tls_bookie_args

pytestmark = [pytest.mark.spark, pytest.mark.integration]

SHORT = {"client.addTimeout": "3", "client.readTimeout": "3"}   # no long waits on failures


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory, bk_cluster):
    """3 bookies serving TLS only (``bk_cluster`` first: it sets the environment Spark's
    workers need)."""
    d = tmp_path_factory.mktemp("tls-bookies")
    key, cert = self_signed(d, "bookies")
    with LocalCluster(num_bookies=3, data_dir=str(d), extra_args=tls_bookie_args(key, cert)) as c:
        yield c.metadata_uri, str(cert)


def rows_of(df):
    return sorted(r.value.decode() for r in df.collect())


def test_write_and_read_a_log_on_tls_bookies(spark, tls_cluster, log_name):
    uri, ca = tls_cluster
    df = spark.range(200).selectExpr("CAST(id AS STRING) AS value").repartition(2)
    (df.write.format("bookkeeper").option("metadataServiceUri", uri)
     .option("client.tlsCaFile", ca).option("client.addTimeout", "30").mode("append")
     .save(log_name))
    # Spark lower-cases option names: every spelling of a field is the same setting
    back = (spark.read.format("bookkeeper").option("metadataServiceUri", uri)
            .option("client.tls_ca_file", ca).load(log_name))
    assert rows_of(back) == sorted(str(i) for i in range(200))
    with BookKeeper(uri, tls_ca_file=ca) as bk:          # two tasks, two TLS-written ledgers
        assert len(LogStore(bk).get(log_name)[0].ledgers) == 2


def test_without_the_ca_file_the_error_names_tls(spark, tls_cluster, log_name):
    uri, ca = tls_cluster
    with BookKeeper(uri, tls_ca_file=ca) as bk, LogStore(bk).open_writer(log_name) as w:
        w.append(b"secret")
    started = time.monotonic()
    # a write fails at planning: no bookie this client can talk to
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    with pytest.raises(Exception, match=r"(?s)accepts TLS connections only.*client\.tlsCaFile"):
        (df.write.format("bookkeeper").option("metadataServiceUri", uri).options(**SHORT)
         .mode("append").save(log_name))
    # a read fails in its tasks, on the bookies' refusal, said to be TLS
    with pytest.raises(Exception, match=r"(?s)accepts TLS connections only.*client\.tlsCaFile"):
        (spark.read.format("bookkeeper").option("metadataServiceUri", uri).options(**SHORT)
         .load(log_name).collect())
    assert time.monotonic() - started < 60


def test_a_bad_client_option_fails_at_planning(spark, tls_cluster, log_name):
    uri, _ = tls_cluster
    with pytest.raises(Exception, match=r"unknown option 'client\.tlscafil': did you mean "
                                        r"'client\.tlsCaFile'\?"):
        (spark.read.format("bookkeeper").option("metadataServiceUri", uri)
         .option("client.tlsCaFil", "/etc/ca.pem").load(log_name).collect())

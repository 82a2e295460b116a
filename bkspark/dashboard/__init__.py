"""The cluster dashboard (``bkspark dashboard``): a live page of bookies, logs and
under-replication, from the cluster's metadata and the bookies' ``/metrics``.

* :mod:`.collector` -- samples the cluster into bounded histories;
* :mod:`.server` -- the page, its JSON, detail pages and token-guarded actions.
"""
from .collector import Collector
from .server import Dashboard

__all__ = ["Collector", "Dashboard"]

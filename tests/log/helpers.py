"""Helpers of the log tests: closed ledgers to commit, and a log read back whole."""
from bkspark.log import EARLIEST


def closed_ledger(bk, datas):
    """A closed ledger (E=3 Qw=2 Qa=2, password ``pw``) holding ``datas``; its id."""
    lh = bk.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"pw")
    for d in datas:
        lh.append(d)
    lh.close()
    return lh.ledger_id


def read_all(logs, name):
    """Every record of the log, in order (no tailing)."""
    with logs.open_reader(name, EARLIEST, tail=False) as reader:
        return [r.data for r in reader]

"""Positions in a log: (ledger id, entry id), ordered by the ledger's place in the log."""
from __future__ import annotations

import json
from typing import NamedTuple

from bkspark.errors import BadRequestError


class Position(NamedTuple):
    """An entry of a log. ``entry_id`` -1 means "before the first entry of that ledger"."""

    ledger_id: int
    entry_id: int

    def to_json(self) -> dict:
        return {"ledger": self.ledger_id, "entry": self.entry_id}

    @classmethod
    def from_json(cls, obj) -> "Position":
        if isinstance(obj, str):
            obj = json.loads(obj)
        try:
            ledger, entry = obj["ledger"], obj["entry"]
        except (TypeError, KeyError):
            raise BadRequestError(f"a position is {{\"ledger\": L, \"entry\": E}}, got {obj!r}") from None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (ledger, entry)):
            raise BadRequestError(f"position ledger and entry must be integers, got {obj!r}")
        return cls(ledger, entry)


EARLIEST = "earliest"
LATEST = "latest"

"""Who does the one-off jobs of a shared study: its duties (``Duty``: the edge search, the
recommendation) claimed once by one worker in a table of their own (``Claims``), and
the names of the studies a storage holds.
"""

from __future__ import annotations

import os
import socket
import time
from enum import StrEnum

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from tuner.search import optuna_store
from tuner.search.optuna_store import (
    RDBStorage,
)
from tuner.search.study.storage import retry_schema_race


class Duty(StrEnum):
    """What exactly one worker of a study does."""

    PREPARE = "prepare"  # the set-up: time scale, streamed share, vLLM's defaults as trial 0
    FINALIZE = "finalize"  # the OOM edge, the confirmations and the recommendation


def _legacy_marker(name: str, names: set[str]) -> bool:
    """A ``<study>.prepare`` or ``<study>.finalize`` study older runs created as a claim."""
    base, dot, what = name.rpartition(".")
    return bool(dot) and what in {d.value for d in Duty} and base in names


def study_names(storage: RDBStorage | str) -> list[str]:
    """The studies of a storage (an RDBStorage or a URL), without the claim markers of older
    runs; what every reader of a storage lists (the tune, the report)."""
    names = set(optuna_store.all_study_names(storage))
    return sorted(n for n in names if not _legacy_marker(n, names))


CLAIMS_TABLE = "tuner_claims"


class Claims:
    """The duties of one study's workers, each taken by exactly one of them.

    A row per duty in a table of the tuner's own beside Optuna's (its primary key makes
    the second insert fail), so the study list (``optuna-dashboard``, ``tuner report``)
    shows only the study. Older runs claimed by creating marker studies; those still count.
    """

    def __init__(self, storage: RDBStorage, study_name: str) -> None:
        self.storage = storage
        self.study_name = study_name

    def _table(self) -> sa.Table:
        metadata = sa.MetaData()
        table = sa.Table(
            CLAIMS_TABLE, metadata,
            sa.Column("study_id", sa.Integer, primary_key=True),
            sa.Column("duty", sa.String(32), primary_key=True),
            sa.Column("study_name", sa.String(512), nullable=False),
            sa.Column("holder", sa.String(512), nullable=False),
            sa.Column("at_unix_s", sa.Float, nullable=False),
        )  # fmt: skip
        retry_schema_race(lambda: metadata.create_all(self.storage.engine, checkfirst=True))
        return table

    def take(self, duty: Duty) -> bool:
        """True for exactly one caller per study and duty."""
        if f"{self.study_name}.{duty.value}" in _all_study_names(self.storage):
            return False  # claimed by an older run, as a marker study
        table = self._table()
        study_id = self.storage.get_study_id_from_name(self.study_name)
        row = {
            "study_id": study_id, "duty": duty.value, "study_name": self.study_name,
            "holder": f"{socket.gethostname()}:{os.getpid()}", "at_unix_s": time.time(),
        }  # fmt: skip
        try:
            with self.storage.engine.begin() as conn:
                conn.execute(table.insert().values(**row))
        except IntegrityError:
            return False
        return True

    def holder(self, duty: Duty) -> str | None:
        """Who took ``duty`` (host:pid), None when nobody has."""
        table = self._table()
        study_id = self.storage.get_study_id_from_name(self.study_name)
        with self.storage.engine.connect() as conn:
            found = conn.execute(
                sa.select(table.c.holder).where(
                    table.c.study_id == study_id, table.c.duty == duty.value
                )
            ).scalar()
        return str(found) if found is not None else None


def _all_study_names(storage: RDBStorage) -> set[str]:
    return set(optuna_store.all_study_names(storage))

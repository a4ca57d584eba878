"""What every cutline function does first in a Spark Python worker, whatever its task."""

from __future__ import annotations

import gc

__all__ = ["freeze_worker_heap"]


def freeze_worker_heap() -> None:
    """Take every object alive now out of the cyclic garbage collector's sight (``gc.freeze``).

    PySpark's daemon runs a full ``gc.collect()`` after every task of a reused Python worker, and a
    full collection walks every tracked object: in a worker that has imported pyarrow, pandas and
    cutline that walk cost each task more than a keyed step's own work on a micro-batch. Called
    at the start of a task, it leaves the collection after the task only the task's own objects.
    Frozen objects are still freed by reference counting; only reference cycles among them stay.
    """
    gc.freeze()

"""The ``cutline-kafka`` source (being split along its seams: issue 52)."""

from spark_tasks.kafka_source.reader import *  # noqa: F403
from spark_tasks.kafka_source.reader import (  # noqa: F401
    BACKGROUND_FETCH_WAIT_MAX_MS,
    _row,
    entry_barrier,
)

"""cutline for Spark Structured Streaming (the ``spark`` extra: PySpark, PyArrow, pandas)."""

from events.extras import require

require("spark", "cutline's Spark integration (spark_tasks)")

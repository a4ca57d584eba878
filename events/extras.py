"""Optional parts of cutline and the extras that install them (``pip install 'cutline[spark]'``).

The core install is the protocol, the coordinator, the participant library and the CLI. Spark
jobs need the ``spark`` extra (PySpark, PyArrow, pandas: about 0.5 GB), ``cutline replay
--plot`` the ``plot`` extra (matplotlib), the Confluent Schema Registry wire format the
``registry`` extra (confluent-kafka's schema registry client), snapshots on S3 the ``s3``
extra (s3fs), a Spark Connect session the ``connect`` extra (PySpark's Connect client). A command
that needs a missing extra says which.
"""

from __future__ import annotations

import importlib.util


class MissingExtra(ImportError):
    """A feature needs an optional dependency that is not installed."""


EXTRAS = {
    "spark": ("pyspark", "pyarrow", "pandas"),
    "connect": ("pyspark", "grpc", "grpc_status", "zstandard"),
    "plot": ("matplotlib",),
    "registry": ("certifi", "attrs", "cachetools", "authlib"),
    "s3": ("fsspec", "s3fs"),
}


def require(extra: str, purpose: str) -> None:
    """Raise :class:`MissingExtra` naming ``extra`` if any of its modules is not installed."""
    missing = [module for module in EXTRAS[extra] if importlib.util.find_spec(module) is None]
    if missing:
        raise MissingExtra(
            f"{purpose} needs the {extra!r} extra ({', '.join(missing)} not installed): "
            f"pip install 'cutline[{extra}]' (in a checkout: uv sync --extra {extra})"
        )

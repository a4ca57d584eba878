"""Every client setting name librdkafka (with confluent-kafka), aiokafka and Faust accept, read
from the installed packages: what tests/unit/test_secret_names.py checks :func:`is_secret` against.

    uv run python tests/client_properties/generate.py   # rewrites the three lists

Each list is ``name<TAB>secret`` or ``name<TAB>shown``, one name a line. A new name (after a
library upgrade) is written with the verdict ``is_secret`` gives it now and ``NEW`` after it:
look at it, decide, and remove ``NEW``; the test fails while one is there. The verdicts already in
a list are kept, so a change of the rule shows as a failing test, not as a silently new list.

Sources:

- librdkafka.tsv: ``rd_kafka_conf_properties_show()`` of the librdkafka that confluent-kafka ships
  (its CONFIGURATION.md tables, global and topic properties), plus confluent-kafka's own
  configuration keys for Python callables (``error_cb``, ``oauth_cb``, ...: the ``*_cb``,
  ``on_*`` and ``logger`` strings of its ``cimpl`` module that its documentation lists as
  configuration).
- aiokafka.tsv: the keyword arguments of ``AIOKafkaProducer.__init__`` and
  ``AIOKafkaConsumer.__init__``.
- faust.tsv: every name of ``faust.types.settings.Settings``, and the arguments of Faust's broker
  credentials (``SASLCredentials``, ``GSSAPICredentials``, ``SSLCredentials``, ``OAuthCredentials``).
"""

from __future__ import annotations

import ctypes
import inspect
import os
import re
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
CONFLUENT_KAFKA_CALLABLES = (
    "error_cb", "logger", "oauth_cb", "on_commit", "on_delivery", "stats_cb", "throttle_cb",
)  # fmt: skip


def librdkafka_names() -> list[str]:
    import confluent_kafka

    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    library = ctypes.CDLL(str(next(libs.glob("librdkafka*.so*"))))
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    library.rd_kafka_conf_properties_show.argtypes = [ctypes.c_void_p]
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "CONFIGURATION.md")
        stream = libc.fopen(path.encode(), b"w")
        library.rd_kafka_conf_properties_show(stream)
        libc.fclose(stream)
        text = Path(path).read_text()
    names = [m.group(1) for m in re.finditer(r"^([a-z][a-z0-9._]*)\s+\|", text, re.MULTILINE)]
    return sorted({*names, *CONFLUENT_KAFKA_CALLABLES})


def aiokafka_names() -> list[str]:
    import aiokafka

    return sorted(
        {
            name
            for cls in (aiokafka.AIOKafkaProducer, aiokafka.AIOKafkaConsumer)
            for name in inspect.signature(cls.__init__).parameters
            if name != "self"
        }
    )


def faust_names() -> list[str]:
    import faust
    from faust.types.settings import Settings

    credentials = [faust.SASLCredentials, faust.GSSAPICredentials, faust.SSLCredentials]
    credentials.append(faust.OAuthCredentials)
    arguments = {name for cls in credentials for name in inspect.signature(cls.__init__).parameters}
    return sorted({name for name in dir(Settings) if not name.startswith("_")} | arguments - {"self"})


SOURCES = {"librdkafka.tsv": librdkafka_names, "aiokafka.tsv": aiokafka_names, "faust.tsv": faust_names}


def read(path: Path) -> dict[str, str]:
    """A list's verdicts by name (``secret``, ``shown``, or either followed by `` NEW``)."""
    if not path.exists():
        return {}
    rows = (line.split("\t") for line in path.read_text().splitlines() if line and not line.startswith("#"))
    return {name: verdict for name, verdict in rows}


def write(path: Path, names: list[str]) -> None:
    from events.kafka.client_config import is_secret

    known = read(path)
    header = f"# written by tests/client_properties/generate.py, verdicts reviewed by hand: {path.stem}\n"
    new = {name: ("secret" if is_secret(name) else "shown") + " NEW" for name in names}
    lines = [f"{name}\t{known.get(name) or new[name]}\n" for name in names]
    path.write_text(header + "".join(lines))


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(HERE.parent.parent))
    for file, names in SOURCES.items():
        write(HERE / file, names())

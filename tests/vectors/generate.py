"""Write the golden test vectors of the cutline wire format (see README.md here).

    uv run python tests/vectors/generate.py            # next version directory, if schemas changed
    uv run python tests/vectors/generate.py --check    # exit 1 when the newest vectors are stale
    uv run python tests/vectors/generate.py --version v1 --force   # rewrite v1 (same schemas only!)

For every record type in ``events.wire.records.RECORD_TYPES`` it writes into
``tests/vectors/v<N>/``:

- ``<Name>.bin`` / ``<Name>.json``: a fully populated example (every union
  non-null, every map and array non-empty) as the exact single-object frame
  and as the Avro JSON encoding of the datum (fastavro's ``json_writer``: union
  branches tagged, bytes as ISO-8859-1 code points);
- ``<Name>.minimal.bin`` / ``<Name>.minimal.json``, for types with optional
  fields: only the required fields, every other field at its default;
- ``<Name>.schema.json``: the writer schema (self-contained), its parsing
  canonical form and its CRC-64-AVRO fingerprint;
- ``index.json``: every vector of the directory.

The examples are fixed values, so the output is byte-for-byte reproducible. A
version directory is the baseline the schema-compatibility tests check every
later schema against, so it is never overwritten unless ``--force`` is given;
a schema change goes into a new directory (``v2``, ``v3``, ...).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fastavro import json_reader, json_writer, schemaless_writer
from fastavro.schema import parse_schema, to_parsing_canonical_form

from events.wire.codec import MAGIC, SCHEMAS_DIR, Codec, to_avro
from events.wire.records import (
    RECORD_TYPES,
    CheckpointAborted,
    CheckpointAcknowledged,
    CheckpointBarrier,
    CheckpointCompleted,
    CheckpointConfig,
    CheckpointDeclined,
    CheckpointFailureThresholdExceeded,
    CheckpointKind,
    CheckpointRequested,
    CheckpointRequestQueued,
    CheckpointRestored,
    CheckpointTriggered,
    CoordinatorClaimed,
    DeadLetter,
    ExecutionState,
    JobCancelRequested,
    JobFailedPermanently,
    JobHeartbeat,
    JobHeartbeatRecorded,
    JobRestartScheduled,
    JobStatus,
    JobStatusChanged,
    JobStopRequested,
    LatencyMeasured,
    Record,
    RestartStrategy,
    RestartStrategyKind,
    SchedulerStarted,
    SchedulerStopped,
    StateHandle,
    TaskAcknowledged,
    TaskStatusChanged,
    TaskStatusRecorded,
    TriggerRejected,
)
from events.wire.writer_schema import NAMESPACE, schema_fingerprint

VECTORS_DIR = Path(__file__).resolve().parent
VERSION_RE = re.compile(r"^v([1-9][0-9]*)$")

# ----------------------------------------------------------------- the examples
# Wire-level examples: every field set, values plausible, a few chosen to
# exercise the encoding (multi-byte varints, a negative long, non-ASCII text,
# bytes >= 0x80, a map of records).

JOB = "wordcount"
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
ROOT = "file:///var/lib/cutline/checkpoints"
CONFIG = CheckpointConfig(
    interval_ms=1_000,
    location=ROOT,
    timeout_ms=60_000,
    min_pause_ms=500,
    max_concurrent=2,
    tolerable_failures=3,
    retained=5,
    heartbeat_interval_ms=5_000,
    heartbeat_timeout_ms=30_000,
    inline_threshold_bytes=20_480,
    restart_strategy=RestartStrategy(
        kind=RestartStrategyKind.FAILURE_RATE,
        attempts=3,
        delay_ms=2_500,
        initial_backoff_ms=500,
        max_backoff_ms=120_000,
        backoff_multiplier=2.0,
        reset_backoff_threshold_ms=600_000,
        jitter_factor=0.25,
        attempts_before_reset_backoff=10,
        max_failures_per_interval=4,
        failure_rate_interval_ms=300_000,
    ),
)
INLINE_STATE = b'{"the":3,"\xc3\xa9t\xc3\xa9":1}\n'
HANDLE_0 = StateHandle(  # small state, inline in the ack (no file at the uri)
    f"{ROOT}/{JOB}/chk-42/words-0.snapshot",
    20,
    "c42c0836a196914dd7e9805ab6673a02835c2176d6b39107f6bce71b1fea0704",
    inline=INLINE_STATE,
)
HANDLE_1 = StateHandle(
    f"{ROOT}/{JOB}/chk-42/words-1.snapshot",
    3_145_728,
    "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752",
)
OFFSETS = {"words:0": 1_234_567, "words:1": 89}
METRICS = {"sync_duration_ms": 12, "records": 5_000_000_000, "watermark_lag_ms": -3}
TASKS = ("words-0", "words-1")

FULL: dict[type[Record], Record] = {
    JobStatusChanged: JobStatusChanged(
        job_id=JOB,
        status=JobStatus.RUNNING,
        timestamp_ms=T0,
        attempt=2,
        tasks=TASKS,
        config=CONFIG,
        error="restarted after: Zähler übergelaufen ✗",
        restored_checkpoint_id=41,
        restored_location=f"{ROOT}/{JOB}/chk-41",
    ),
    TaskStatusChanged: TaskStatusChanged(
        job_id=JOB,
        task_id="words-1",
        attempt=2,
        status=ExecutionState.FAILED,
        timestamp_ms=T0 + 5,
        error="java.io.IOException: No space left on device",
    ),
    CheckpointRequested: CheckpointRequested(
        job_id=JOB,
        kind=CheckpointKind.SAVEPOINT,
        timestamp_ms=T0 + 10,
        request_id="req-7f3a",
        target="file:///var/lib/cutline/savepoints/before-upgrade",
    ),
    CheckpointBarrier: CheckpointBarrier(
        job_id=JOB,
        checkpoint_id=42,
        attempt=2,
        kind=CheckpointKind.CHECKPOINT,
        timestamp_ms=T0 + 20,
        location=f"{ROOT}/{JOB}/chk-42",
        inline_limit_bytes=20_480,
        stop=True,
        drain=True,
    ),
    CheckpointAcknowledged: CheckpointAcknowledged(
        job_id=JOB,
        checkpoint_id=42,
        attempt=2,
        task_id="words-0",
        timestamp_ms=T0 + 35,
        state=HANDLE_0,
        offsets=OFFSETS,
        metrics=METRICS,
    ),
    CheckpointDeclined: CheckpointDeclined(
        job_id=JOB,
        checkpoint_id=43,
        attempt=2,
        task_id="words-1",
        timestamp_ms=T0 + 1_040,
        reason="TASK_CHECKPOINT_FAILURE",
        message="snapshot write failed: permission denied",
    ),
    SchedulerStarted: SchedulerStarted(
        job_id=JOB,
        attempt=2,
        timestamp_ms=T0,
        tasks=TASKS,
        config=CONFIG,
        next_trigger_ms=T0 + 734,
    ),
    SchedulerStopped: SchedulerStopped(
        job_id=JOB,
        attempt=2,
        timestamp_ms=T0 + 9_000,
        status=JobStatus.FAILING,
        error="task words-1 failed",
    ),
    TaskStatusRecorded: TaskStatusRecorded(
        job_id=JOB,
        task_id="words-1",
        attempt=2,
        status=ExecutionState.FAILED,
        timestamp_ms=T0 + 5,
        error="java.io.IOException: No space left on device",
    ),
    CheckpointRequestQueued: CheckpointRequestQueued(
        job_id=JOB,
        kind=CheckpointKind.SAVEPOINT,
        periodic=False,
        timestamp_ms=T0 + 10,
        request_id="req-7f3a",
        target="file:///var/lib/cutline/savepoints/before-upgrade",
        next_trigger_ms=T0 + 1_734,
    ),
    CheckpointTriggered: CheckpointTriggered(
        job_id=JOB,
        checkpoint_id=42,
        attempt=2,
        kind=CheckpointKind.CHECKPOINT,
        timestamp_ms=T0 + 20,
        location=f"{ROOT}/{JOB}/chk-42",
        tasks=TASKS,
        deadline_ms=T0 + 60_020,
        periodic=True,
        request_id="req-7f3b",
        next_trigger_ms=T0 + 1_020,
        inline_limit_bytes=20_480,
        stop=True,
        drain=True,
    ),
    TaskAcknowledged: TaskAcknowledged(
        job_id=JOB,
        checkpoint_id=42,
        attempt=2,
        task_id="words-0",
        timestamp_ms=T0 + 35,
        state=HANDLE_0,
        offsets=OFFSETS,
        metrics=METRICS,
    ),
    CheckpointCompleted: CheckpointCompleted(
        job_id=JOB,
        checkpoint_id=42,
        kind=CheckpointKind.CHECKPOINT,
        timestamp_ms=T0 + 41,
        duration_ms=21,
        handles={"words-0": HANDLE_0, "words-1": HANDLE_1},
        size_bytes=HANDLE_0.size_bytes + HANDLE_1.size_bytes,
        offsets=OFFSETS,
        attempt=2,
        location=f"{ROOT}/{JOB}/chk-42",
        metadata=StateHandle(
            f"{ROOT}/{JOB}/chk-42/_metadata",
            9_437_311,
            "3b8e3b1c0b7f1e0d6c2a5f4e9d8c7b6a5f4e3d2c1b0a99887766554433221100",
        ),
    ),
    CheckpointAborted: CheckpointAborted(
        job_id=JOB,
        checkpoint_id=43,
        timestamp_ms=T0 + 1_041,
        reason="CHECKPOINT_DECLINED",
        message="snapshot write failed: permission denied",
        task_id="words-1",
        counts_as_failure=True,
    ),
    TriggerRejected: TriggerRejected(
        job_id=JOB,
        reason="MINIMUM_TIME_BETWEEN_CHECKPOINTS",
        request_id="req-7f3c",
        timestamp_ms=T0 + 1_100,
        kind=CheckpointKind.SAVEPOINT,
        periodic=True,
        message="last checkpoint completed 100 ms ago, min pause is 500 ms",
        next_trigger_ms=T0 + 1_541,
    ),
    CheckpointFailureThresholdExceeded: CheckpointFailureThresholdExceeded(
        job_id=JOB,
        checkpoint_id=46,
        timestamp_ms=T0 + 60_000,
        failures=4,
        tolerable=3,
        reason="CHECKPOINT_EXPIRED",
    ),
    CheckpointRestored: CheckpointRestored(
        job_id=JOB,
        checkpoint_id=42,
        attempt=3,
        timestamp_ms=T0 + 70_000,
        location=f"{ROOT}/{JOB}/chk-42",
    ),
    DeadLetter: DeadLetter(
        topic="cutline.acks",
        partition=3,
        offset=1_234,
        reason="UNKNOWN_SCHEMA",
        message="no known schema has fingerprint 00112233445566ff",
        timestamp_ms=T0 + 2_000,
        key=JOB.encode(),
        value=b"\xc3\x01\x00\x11\x22\x33\x44\x55\x66\xff\x80\x7f",
        job_id=JOB,
    ),
    CoordinatorClaimed: CoordinatorClaimed(
        partition=3, epoch=7, worker_id="coordinator-host-4242-9f1c", timestamp_ms=T0 + 3_000
    ),
    JobHeartbeat: JobHeartbeat(job_id=JOB, attempt=2, timestamp_ms=T0 + 4_000),
    JobStopRequested: JobStopRequested(
        job_id=JOB,
        timestamp_ms=T0 + 11,
        request_id="req-7f3c",
        target="file:///var/lib/cutline/savepoints/before-upgrade",
        drain=True,
    ),
    JobCancelRequested: JobCancelRequested(job_id=JOB, timestamp_ms=T0 + 12, request_id="req-7f3d"),
    LatencyMeasured: LatencyMeasured(
        job_id=JOB,
        attempt=2,
        timestamp_ms=T0 + 5_312,
        marked_time_ms=T0 + 5_000,
        source_id="cutline-kafka",
        source_subtask_index=3,
        operator_id="keyed",
        operator_subtask_index=7,
    ),
    JobHeartbeatRecorded: JobHeartbeatRecorded(
        job_id=JOB, attempt=2, timestamp_ms=T0 + 4_001, deadline_ms=T0 + 34_001
    ),
    JobRestartScheduled: JobRestartScheduled(
        job_id=JOB,
        attempt=3,
        timestamp_ms=T0 + 60_000,
        delay_ms=1_350,
        failure="no heartbeat of attempt 2 for 30000 ms (heartbeat_timeout_ms)",
        restarts=2,
        backoff_ms=1_500,
        restore_checkpoint_id=42,
        restore_location=f"{ROOT}/{JOB}/chk-42",
    ),
    JobFailedPermanently: JobFailedPermanently(
        job_id=JOB,
        attempt=5,
        timestamp_ms=T0 + 90_000,
        reason="fixed-delay: all 3 restart attempts are used (restart-strategy.fixed-delay.attempts)",
        failure="attempt 5 reported FAILING",
    ),
}

MINIMAL: dict[type[Record], Record] = {
    JobStatusChanged: JobStatusChanged(job_id=JOB, status=JobStatus.CREATED, timestamp_ms=T0, attempt=0),
    TaskStatusChanged: TaskStatusChanged(
        job_id=JOB, task_id="words-0", attempt=0, status=ExecutionState.RUNNING, timestamp_ms=T0
    ),
    CheckpointRequested: CheckpointRequested(
        job_id=JOB, kind=CheckpointKind.CHECKPOINT, timestamp_ms=T0, request_id="req-1"
    ),
    CheckpointBarrier: CheckpointBarrier(
        job_id=JOB,
        checkpoint_id=1,
        attempt=0,
        kind=CheckpointKind.CHECKPOINT,
        timestamp_ms=T0,
        location=f"{ROOT}/{JOB}/chk-1",
    ),
    CheckpointAcknowledged: CheckpointAcknowledged(
        job_id=JOB, checkpoint_id=1, attempt=0, task_id="words-0", timestamp_ms=T0
    ),
    SchedulerStarted: SchedulerStarted(
        job_id=JOB, attempt=0, timestamp_ms=T0, tasks=TASKS, config=CheckpointConfig(0, ROOT)
    ),
    SchedulerStopped: SchedulerStopped(job_id=JOB, attempt=0, timestamp_ms=T0, status=JobStatus.CANCELED),
    TaskStatusRecorded: TaskStatusRecorded(
        job_id=JOB, task_id="words-0", attempt=0, status=ExecutionState.RUNNING, timestamp_ms=T0
    ),
    CheckpointRequestQueued: CheckpointRequestQueued(
        job_id=JOB, kind=CheckpointKind.CHECKPOINT, periodic=True, timestamp_ms=T0
    ),
    CheckpointTriggered: CheckpointTriggered(
        job_id=JOB,
        checkpoint_id=1,
        attempt=0,
        kind=CheckpointKind.CHECKPOINT,
        timestamp_ms=T0,
        location=f"{ROOT}/{JOB}/chk-1",
        tasks=TASKS,
        deadline_ms=T0 + 600_000,
    ),
    TaskAcknowledged: TaskAcknowledged(
        job_id=JOB, checkpoint_id=1, attempt=0, task_id="words-0", timestamp_ms=T0
    ),
    CheckpointCompleted: CheckpointCompleted(
        job_id=JOB,
        checkpoint_id=1,
        kind=CheckpointKind.CHECKPOINT,
        timestamp_ms=T0,
        duration_ms=0,
        handles={},
        size_bytes=0,
        offsets={},
    ),
    CheckpointAborted: CheckpointAborted(
        job_id=JOB, checkpoint_id=1, timestamp_ms=T0, reason="CHECKPOINT_EXPIRED", message=""
    ),
    TriggerRejected: TriggerRejected(job_id=JOB, reason="PERIODIC_SCHEDULER_SHUTDOWN"),
    CheckpointRestored: CheckpointRestored(job_id=JOB, checkpoint_id=1, attempt=1, timestamp_ms=T0),
    JobRestartScheduled: JobRestartScheduled(
        job_id=JOB, attempt=2, timestamp_ms=T0, delay_ms=1_000, failure="boom", restarts=1
    ),
    DeadLetter: DeadLetter(
        topic="cutline.acks", partition=0, offset=0, reason="BAD_MAGIC", message="", timestamp_ms=T0
    ),
    JobStopRequested: JobStopRequested(job_id=JOB, timestamp_ms=T0, request_id="req-2"),
}


# ------------------------------------------------------------------ the schemas


def expanded_schema(name: str, schemas_dir: Path = SCHEMAS_DIR) -> dict[str, Any]:
    """The self-contained schema of record ``name``: each named type inlined at its first use.

    Keeps every attribute (docs, defaults) and the order of the ``.avsc`` files,
    so it reads like the source; later uses of a type stay references by name.
    """
    defined: set[str] = set()

    def load(fullname: str) -> dict[str, Any]:
        defined.add(fullname)
        node = json.loads((schemas_dir / f"{fullname}.avsc").read_text())
        return {key: (inline_fields(value) if key == "fields" else value) for key, value in node.items()}

    def inline_fields(fields: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {key: (inline(value) if key == "type" else value) for key, value in f.items()} for f in fields
        ]

    def inline(node: Any) -> Any:
        if isinstance(node, str):
            fullname = node if "." in node else f"{NAMESPACE}.{node}"
            if fullname not in defined and (schemas_dir / f"{fullname}.avsc").is_file():
                return load(fullname)
            return node
        if isinstance(node, list):
            return [inline(branch) for branch in node]
        if isinstance(node, dict):
            if node.get("type") in ("record", "error"):
                return {
                    key: (inline_fields(value) if key == "fields" else value) for key, value in node.items()
                }
            return {
                key: (inline(value) if key in ("items", "values") else value) for key, value in node.items()
            }
        return node

    return load(f"{NAMESPACE}.{name}")


def fingerprint_hex(schema: Mapping[str, Any]) -> str:
    """The CRC-64-AVRO fingerprint of a schema, as the 8 bytes of a frame (little-endian), in hex."""
    return schema_fingerprint(parse_schema(dict(schema), _write_hint=False)).hex()


def current_fingerprints(schemas_dir: Path = SCHEMAS_DIR) -> dict[str, str]:
    return {cls.__name__: fingerprint_hex(expanded_schema(cls.__name__, schemas_dir)) for cls in RECORD_TYPES}


def versions(vectors_dir: Path = VECTORS_DIR) -> list[Path]:
    """The version directories ``v1``, ``v2``, ... oldest first."""
    found = [p for p in vectors_dir.iterdir() if p.is_dir() and VERSION_RE.match(p.name)]
    return sorted(found, key=lambda p: int(p.name[1:]))


def vector_fingerprints(version_dir: Path) -> dict[str, str]:
    """Record name -> fingerprint hex of the writer schemas in one version directory."""
    out = {}
    for path in sorted(version_dir.glob("*.schema.json")):
        info = json.loads(path.read_text())
        out[path.name.removesuffix(".schema.json")] = info["fingerprint"]["crc64_avro_hex"]
    return out


# -------------------------------------------------------------------- checks


def _is_default(value: Any, f: dataclasses.Field[Any]) -> bool:
    if f.default is not dataclasses.MISSING:
        return bool(value == f.default)
    if f.default_factory is not dataclasses.MISSING:
        return bool(value == f.default_factory())
    return False


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, (Mapping, tuple, list)) and not value)


def check_examples() -> None:
    """Every type has a fully populated example and, when it has optional fields, a minimal one."""
    problems = []
    for cls in RECORD_TYPES:
        full = FULL.get(cls)
        if full is None:
            problems.append(f"{cls.__name__}: no FULL example")
            continue
        fields = dataclasses.fields(cls)
        for f in fields:
            if _empty(getattr(full, f.name)):
                problems.append(f"{cls.__name__}.{f.name}: FULL example leaves it null or empty")
        optional = [
            f
            for f in fields
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        ]
        minimal = MINIMAL.get(cls)
        if optional and minimal is None:
            problems.append(f"{cls.__name__}: has optional fields but no MINIMAL example")
        if not optional and minimal is not None:
            problems.append(f"{cls.__name__}: has no optional fields, drop its MINIMAL example")
        if minimal is not None:
            for f in optional:
                if not _is_default(getattr(minimal, f.name), f):
                    problems.append(
                        f"{cls.__name__}.{f.name}: MINIMAL example sets it, leave it at its default"
                    )
    if problems:
        raise SystemExit("generate.py examples are incomplete:\n  " + "\n  ".join(problems))


# ---------------------------------------------------------------------- writing


def _avro_json(parsed: Any, datum: Mapping[str, Any]) -> str:
    """The Avro JSON encoding of one datum (fastavro's json_writer), pretty-printed, ASCII only."""
    out = io.StringIO()
    json_writer(out, parsed, [datum])
    return json.dumps(json.loads(out.getvalue()), indent=2, ensure_ascii=True) + "\n"


def read_avro_json(text: str, parsed: Any, reader: Any = None) -> dict[str, Any]:
    """The datum of a pretty-printed Avro JSON file (fastavro's json_reader wants one datum per line)."""
    (datum,) = list(json_reader(io.StringIO(json.dumps(json.loads(text))), parsed, reader))
    return dict(datum)


def write_vectors(target: Path, version: str, codec: Codec | None = None) -> list[dict[str, str]]:
    """Write every vector of ``version`` into ``target`` (which must not exist); the index entries."""
    codec = codec or Codec(previous_writes=False)  # the vectors are this version's frames
    target.mkdir(parents=True)
    index = []
    for cls in RECORD_TYPES:
        name = cls.__name__
        schema = expanded_schema(name)
        parsed = parse_schema(schema, _write_hint=False)
        fp = schema_fingerprint(parsed)
        if fp != codec.registry.current(name).fingerprint:
            raise SystemExit(f"{name}: expanded schema does not match the codec's (fingerprint {fp.hex()})")
        canonical = to_parsing_canonical_form(parsed)
        schema_file = f"{name}.schema.json"
        info = {
            "name": f"{NAMESPACE}.{name}",
            "fingerprint": {
                "algorithm": "CRC-64-AVRO",
                "crc64_avro_hex": fp.hex(),
                "int64": int.from_bytes(fp, "little", signed=True),
            },
            "canonical_form": canonical,
            "schema": schema,
        }
        (target / schema_file).write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n")
        variants = [("full", FULL[cls])] + ([("minimal", MINIMAL[cls])] if cls in MINIMAL else [])
        for variant, record in variants:
            stem = name if variant == "full" else f"{name}.{variant}"
            datum = to_avro(record)
            frame = codec.encode(record)
            body = io.BytesIO()
            schemaless_writer(body, parsed, datum)
            text = _avro_json(parsed, datum)
            # the three forms must agree before anything is kept
            assert frame == MAGIC + fp + body.getvalue(), name
            assert codec.decode(frame) == record, name
            reread = read_avro_json(text, parsed)
            again = io.BytesIO()
            schemaless_writer(again, parsed, reread)
            assert again.getvalue() == body.getvalue(), name
            (target / f"{stem}.bin").write_bytes(frame)
            (target / f"{stem}.json").write_text(text)
            index.append(
                {
                    "record": name,
                    "variant": variant,
                    "frame": f"{stem}.bin",
                    "json": f"{stem}.json",
                    "schema": schema_file,
                    "fingerprint": fp.hex(),
                }
            )
    (target / "index.json").write_text(
        json.dumps({"version": version, "magic": MAGIC.hex(), "vectors": index}, indent=2) + "\n"
    )
    return index


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", help="version directory to write, e.g. v2 (default: the next one)")
    parser.add_argument("--force", action="store_true", help="replace an existing version directory")
    parser.add_argument("--check", action="store_true", help="only check the newest vectors are current")
    parser.add_argument("--out-dir", type=Path, default=VECTORS_DIR, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    check_examples()

    existing = versions(args.out_dir)
    current = current_fingerprints()
    newest = existing[-1] if existing else None
    up_to_date = newest is not None and vector_fingerprints(newest) == current
    if args.check:
        if up_to_date:
            print(f"{_shown(newest)} matches the current schemas")
            return 0
        print(f"the current schemas have no vectors yet: run {Path(__file__).name} to write a new version")
        return 1

    if args.version:
        if not VERSION_RE.match(args.version):
            parser.error(f"--version must look like v1, v2, ...; got {args.version!r}")
        target = args.out_dir / args.version
    elif newest is None:
        target = args.out_dir / "v1"
    elif up_to_date and not args.force:
        print(f"{_shown(newest)} already matches the current schemas; nothing to do (--force rewrites it)")
        return 0
    elif up_to_date:
        target = newest
    else:
        target = args.out_dir / f"v{int(newest.name[1:]) + 1}"

    if target.exists():
        if not args.force:
            print(
                f"refusing to overwrite {_shown(target)}: it is a compatibility baseline (use --force)",
                file=sys.stderr,
            )
            return 2
        if vector_fingerprints(target) != current:
            print(
                f"warning: {_shown(target)} was written with other schemas; it is replaced", file=sys.stderr
            )

    staging = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        index = write_vectors(staging, target.name)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    print(f"wrote {len(index)} vectors of {len(RECORD_TYPES)} record types to {_shown(target)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

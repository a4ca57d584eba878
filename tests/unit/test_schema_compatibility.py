"""Schema evolution against the golden vectors (tests/vectors/v*/, docs/design.md, "Wire protocol").

Every vector directory is a schema version some writer or reader may still
run. The current schemas must read what each version wrote (backward), each
version must read what the current schemas write (forward), and a schema may
not change without a new vector directory recording it.
"""

from __future__ import annotations

import copy
import io
import json
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import avro.schema
import pytest
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
from fastavro import json_reader, json_writer, schemaless_reader, schemaless_writer
from fastavro.schema import parse_schema, to_parsing_canonical_form

from events.wire.codec import HEADER_SIZE, MAGIC, Codec, UnknownFingerprint, to_avro
from events.wire.records import RECORD_TYPES
from events.wire.writer_schema import schema_fingerprint

VECTORS_DIR = Path(__file__).resolve().parents[1] / "vectors"
VERSION_RE = re.compile(r"^v([1-9][0-9]*)$")
GENERATE = "uv run python tests/vectors/generate.py"
CODEC = Codec()
CURRENT_NAMES = [cls.__name__ for cls in RECORD_TYPES]


def _versions() -> list[Path]:
    found = [p for p in VECTORS_DIR.iterdir() if p.is_dir() and VERSION_RE.match(p.name)]
    return sorted(found, key=lambda p: int(p.name[1:]))


VERSIONS = _versions()


def _index(version: Path) -> list[dict[str, str]]:
    return list(json.loads((version / "index.json").read_text())["vectors"])


VECTOR_PARAMS = [
    pytest.param(version, entry, id=f"{version.name}/{entry['frame']}")
    for version in VERSIONS
    for entry in _index(version)
]
SCHEMA_PARAMS = [
    pytest.param(version, path.name.removesuffix(".schema.json"), id=f"{version.name}/{path.name}")
    for version in VERSIONS
    for path in sorted(version.glob("*.schema.json"))
]


@cache
def vector_schema(version: Path, name: str) -> dict[str, Any]:
    """The writer schema of record ``name`` in one vector directory (self-contained, as written)."""
    return dict(json.loads((version / f"{name}.schema.json").read_text())["schema"])


def current_schema(name: str) -> dict[str, Any]:
    return CODEC.registry.current(name).parsed


def read_avro_json(text: str, writer: Any, reader: Any = None) -> dict[str, Any]:
    """The datum of a (pretty-printed) Avro JSON file, resolved to ``reader`` when given."""
    writer = parse_schema(copy.deepcopy(writer), _write_hint=False)
    if reader is not None:
        reader = parse_schema(copy.deepcopy(reader), _write_hint=False)
    (datum,) = list(json_reader(io.StringIO(json.dumps(json.loads(text))), writer, reader))
    return dict(datum)


# ------------------------------------------------- structural compatibility


def _named_types(schema: Any, out: dict[str, Any] | None = None, namespace: str = "") -> dict[str, Any]:
    """Every named type defined in a schema, by full name."""
    out = {} if out is None else out
    if isinstance(schema, list):
        for branch in schema:
            _named_types(branch, out, namespace)
    elif isinstance(schema, dict):
        if schema.get("type") in ("record", "error", "enum", "fixed"):
            name = str(schema["name"])
            namespace = str(schema.get("namespace", namespace))
            fullname = name if "." in name or not namespace else f"{namespace}.{name}"
            namespace = fullname.rpartition(".")[0]
            out[fullname] = schema
            for f in schema.get("fields", []):
                _named_types(f["type"], out, namespace)
        else:
            for key in ("items", "values"):
                if key in schema:
                    _named_types(schema[key], out, namespace)
    return out


def _short(fullname: str) -> str:
    return fullname.rpartition(".")[2]


def _where(schema: dict[str, Any], pointer: str, named: dict[str, Any]) -> str:
    """A JSON pointer of the avro checker (into the reader schema) as a field path."""
    path = _short(str(schema["name"]))
    node: Any = schema
    tokens = [t for t in pointer.split("/") if t]
    i = 0
    while i < len(tokens):
        if isinstance(node, str) and node in named:
            node = named[node]
        token = tokens[i]
        if token == "fields" and i + 1 < len(tokens):
            node = node["fields"][int(tokens[i + 1])]
            path += f".{node['name']}"
            i += 2
        elif token in ("type", "items", "values"):
            node = node[token]
            path += {"type": "", "items": "[]", "values": "{}"}[token]
            i += 1
        elif token.isdigit() and isinstance(node, list):
            node = node[int(token)]
            branch = node if isinstance(node, str) else node.get("name", node.get("type"))
            path += f"<{branch}>"
            i += 1
        else:
            path += f" ({'/'.join(tokens[i:])})"
            break
    return path


def compatibility_problems(reader: dict[str, Any], writer: dict[str, Any]) -> list[str]:
    """Why ``reader`` cannot read what ``writer`` wrote (Avro resolution rules), one line per fault.

    Uses the Apache ``avro`` library's checker (a port of Java's
    ``SchemaCompatibility``). Where it only says a union lacks a record
    branch, the two records of the same name are compared directly, so the
    fault names the field inside.
    """
    checker = ReaderWriterCompatibilityChecker()
    result = checker.get_compatibility(
        avro.schema.parse(json.dumps(reader)), avro.schema.parse(json.dumps(writer))
    )
    if result.compatibility is SchemaCompatibilityType.compatible:
        return []
    named_reader, named_writer = _named_types(reader), _named_types(writer)
    problems = []
    kinds = ", ".join(sorted({i.name for i in result.incompatibilities}))
    details = "; ".join(sorted(result.messages))
    for location in sorted(result.locations - {"/"}) or ["/"]:
        where = _where(reader, location, named_reader)
        problems.append(f"{where}: {kinds}: {details}")
    if any(i.name == "missing_union_branch" for i in result.incompatibilities):
        for fullname, definition in named_reader.items():
            other = named_writer.get(fullname)
            if other is not None and definition.get("type") == "record" and fullname != reader["name"]:
                problems += [f"  inside {p}" for p in compatibility_problems(definition, other)]
    return problems


def _agree(expected: Any, actual: Any, via: Any, path: str) -> list[str]:
    """Where ``actual`` differs from ``expected``; record fields missing from ``via`` are not compared.

    ``via`` is the datum in the current schema that a value passed through:
    a field removed since the vector's version comes back as its default.
    """
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        out = []
        for key, value in expected.items():
            if isinstance(via, Mapping) and key not in via:
                continue
            if key not in actual:
                out.append(f"{path}.{key}: missing")
            else:
                out += _agree(
                    value, actual[key], via[key] if isinstance(via, Mapping) else None, f"{path}.{key}"
                )
        return out
    if isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        vias = via if isinstance(via, list) and len(via) == len(expected) else [None] * len(expected)
        return [
            p
            for n, (e, a, v) in enumerate(zip(expected, actual, vias, strict=True))
            for p in _agree(e, a, v, f"{path}[{n}]")
        ]
    return [] if expected == actual else [f"{path}: expected {expected!r}, got {actual!r}"]


# ------------------------------------------------------ data-level checks


def check_backward(codec: Codec, label: str, frame: bytes, text: str, writer: dict[str, Any]) -> list[str]:
    """Faults in decoding an old frame with the current codec, against the datum of its JSON file."""
    name = _short(str(writer["name"]))
    if name not in CURRENT_NAMES:
        return [f"{label}: record {name} no longer exists; removing a record type breaks old writers"]
    try:
        record = codec.decode(frame)
    except UnknownFingerprint:
        return [
            f"{label}: the codec does not know the schema this frame was written with "
            f"(fingerprint {frame[2:HEADER_SIZE].hex()}); save the 'schema' object of "
            f"{name}.schema.json as schemas/history/cutline.{name}.{frame[2:HEADER_SIZE].hex()}.avsc "
            "so old writers keep working"
        ]
    except Exception as exc:
        return [f"{label}: the current codec cannot decode it: {exc}"]
    if name != type(record).__name__:
        return [f"{label}: decoded as {type(record).__name__}, not {name}"]
    try:
        expected = read_avro_json(text, writer, codec.registry.current(name).parsed)
    except Exception as exc:
        return [f"{label}: fastavro cannot resolve {name} from the old schema to the current one: {exc}"]
    return _agree(expected, to_avro(record), to_avro(record), f"{label}: {name}")


def check_forward(codec: Codec, label: str, frame: bytes, text: str, writer: dict[str, Any]) -> list[str]:
    """Faults in reading, with the old schema, the same record encoded by the current codec."""
    name = _short(str(writer["name"]))
    try:
        record = codec.decode(frame)
        now = codec.encode(record)
    except Exception as exc:
        return [f"{label}: cannot re-encode it with the current codec: {exc}"]
    body = io.BytesIO(now)
    body.seek(HEADER_SIZE)
    try:
        old_view = schemaless_reader(
            body,
            parse_schema(copy.deepcopy(codec.writer_schema(record).parsed), _write_hint=False),
            parse_schema(copy.deepcopy(writer), _write_hint=False),
        )
    except Exception as exc:
        return [f"{label}: a {name} written now does not decode with the old schema as reader: {exc}"]
    if body.tell() != len(now):
        return [f"{label}: the old schema leaves {len(now) - body.tell()} bytes of a current {name} unread"]
    return _agree(read_avro_json(text, writer), old_view, to_avro(record), f"{label}: {name}")


def _vector(version: Path, entry: Mapping[str, str]) -> tuple[str, bytes, str, dict[str, Any]]:
    label = f"{version.name}/{entry['frame']}"
    frame = (version / entry["frame"]).read_bytes()
    text = (version / entry["json"]).read_text()
    return label, frame, text, vector_schema(version, entry["record"])


# -------------------------------------------------------------------- tests


class TestVectorFiles:
    def test_there_is_at_least_one_vector_directory(self) -> None:
        """tests/vectors/v1 exists (written by the generator, committed)."""
        assert VERSIONS, f"no tests/vectors/v*/ directory; run {GENERATE}"
        assert "v1" == VERSIONS[0].name

    @pytest.mark.parametrize("version", VERSIONS, ids=lambda v: v.name)
    def test_the_index_lists_every_frame_and_json_file(self, version: Path) -> None:
        """index.json names every .bin and .json vector of its directory, and only those."""
        index = _index(version)
        listed = sorted([e["frame"] for e in index] + [e["json"] for e in index])
        on_disk = sorted(
            p.name for p in version.iterdir() if p.suffix in (".bin", ".json") and p.name != "index.json"
        )

        assert listed == [n for n in on_disk if not n.endswith(".schema.json")]

    @pytest.mark.parametrize(("version", "name"), SCHEMA_PARAMS)
    def test_the_schema_file_holds_its_canonical_form_and_fingerprint(self, version: Path, name: str) -> None:
        """canonical_form and fingerprint are those of the schema stored next to them."""
        info = json.loads((version / f"{name}.schema.json").read_text())
        parsed = parse_schema(copy.deepcopy(info["schema"]), _write_hint=False)
        fp = schema_fingerprint(parsed)

        assert to_parsing_canonical_form(parsed) == info["canonical_form"]
        assert fp.hex() == info["fingerprint"]["crc64_avro_hex"]
        assert int.from_bytes(fp, "little", signed=True) == info["fingerprint"]["int64"]
        assert f"cutline.{name}" == info["name"]

    @pytest.mark.parametrize(("version", "entry"), VECTOR_PARAMS)
    def test_the_frame_is_the_json_datum_encoded_with_the_writer_schema(
        self, version: Path, entry: dict[str, str]
    ) -> None:
        """Encoding the .json datum with the .schema.json schema gives the .bin bytes exactly."""
        _, frame, text, writer = _vector(version, entry)
        parsed = parse_schema(copy.deepcopy(writer), _write_hint=False)
        body = io.BytesIO()
        schemaless_writer(body, parsed, read_avro_json(text, writer))

        assert MAGIC + schema_fingerprint(parsed) + body.getvalue() == frame

    @pytest.mark.parametrize(("version", "entry"), VECTOR_PARAMS)
    def test_the_json_file_is_what_fastavros_json_writer_writes(
        self, version: Path, entry: dict[str, str]
    ) -> None:
        """The .json file is the Avro JSON encoding of its datum (union branches tagged)."""
        _, _, text, writer = _vector(version, entry)
        out = io.StringIO()
        json_writer(
            out, parse_schema(copy.deepcopy(writer), _write_hint=False), [read_avro_json(text, writer)]
        )

        assert json.loads(out.getvalue()) == json.loads(text)

    def test_the_readme_worked_example_is_the_v1_frame(self) -> None:
        """The bytes annotated in tests/vectors/README.md are those of v1/CheckpointRestored.minimal.bin."""
        readme = (VECTORS_DIR / "README.md").read_text()
        block = readme.split("The 29 bytes of the frame:", 1)[1].split("```")[1]
        hex_bytes = []
        for line in block.splitlines():
            for token in line.split():
                if not re.fullmatch(r"[0-9a-f]{2}", token):
                    break
                hex_bytes.append(token)

        assert (VECTORS_DIR / "v1" / "CheckpointRestored.minimal.bin").read_bytes() == bytes.fromhex(
            "".join(hex_bytes)
        )


class TestBackwardCompatibility:
    @pytest.mark.parametrize(("version", "entry"), VECTOR_PARAMS)
    def test_the_current_codec_decodes_every_old_frame_to_its_json_datum(
        self, version: Path, entry: dict[str, str]
    ) -> None:
        """Each .bin decodes to the .json datum, fields added since filled with their defaults."""
        label, frame, text, writer = _vector(version, entry)

        problems = check_backward(CODEC, label, frame, text, writer)

        assert [] == problems, "\n".join(problems)

    @pytest.mark.parametrize(("version", "name"), SCHEMA_PARAMS)
    def test_the_current_schema_reads_what_the_old_schema_wrote(self, version: Path, name: str) -> None:
        """By Avro's resolution rules, the current schema of a record can read any datum of the old one."""
        assert name in CURRENT_NAMES, f"record {name} of {version.name} was removed from RECORD_TYPES"

        problems = compatibility_problems(current_schema(name), vector_schema(version, name))

        assert [] == problems, (
            f"schemas/cutline.{name}.avsc can no longer read {name} written with {version.name}:\n"
            + "\n".join(problems)
        )


class TestForwardCompatibility:
    @pytest.mark.parametrize(("version", "entry"), VECTOR_PARAMS)
    def test_a_frame_written_now_decodes_with_the_old_schema(
        self, version: Path, entry: dict[str, str]
    ) -> None:
        """Re-encoded by the current codec, each vector reads back with its old schema as the reader."""
        label, frame, text, writer = _vector(version, entry)

        problems = check_forward(CODEC, label, frame, text, writer)

        assert [] == problems, "\n".join(problems)

    @pytest.mark.parametrize(("version", "name"), SCHEMA_PARAMS)
    def test_the_old_schema_reads_what_the_current_schema_writes(self, version: Path, name: str) -> None:
        """By Avro's resolution rules, a reader still on the old schema can read any current datum."""
        assert name in CURRENT_NAMES, f"record {name} of {version.name} was removed from RECORD_TYPES"

        problems = compatibility_problems(vector_schema(version, name), current_schema(name))

        assert [] == problems, (
            f"a reader on {version.name}'s {name} schema can no longer read what "
            f"schemas/cutline.{name}.avsc writes:\n" + "\n".join(problems)
        )


class TestVectorsAreCurrent:
    @pytest.mark.parametrize("name", CURRENT_NAMES)
    def test_every_current_schema_is_the_schema_of_its_newest_vectors(self, name: str) -> None:
        """A schema change without a new vector directory fails, saying how to write one."""
        holding = [v for v in VERSIONS if (v / f"{name}.schema.json").is_file()]
        current = CODEC.registry.current(name).fingerprint.hex()
        next_version = f"v{int(VERSIONS[-1].name[1:]) + 1}" if VERSIONS else "v1"
        assert holding, (
            f"{name} has no golden vectors; run `{GENERATE}` to write tests/vectors/{next_version}"
        )
        newest = holding[-1]

        recorded = json.loads((newest / f"{name}.schema.json").read_text())["fingerprint"]["crc64_avro_hex"]

        assert recorded == current, (
            f"schemas/cutline.{name}.avsc changed since tests/vectors/{newest.name} "
            f"(fingerprint {recorded} -> {current}). Run `{GENERATE}` to write the vectors of the new "
            f"schemas into tests/vectors/{next_version} (never overwrite {newest.name}: it is the "
            f"baseline old clients are checked against), and save the old schema from "
            f"tests/vectors/{newest.name}/{name}.schema.json into schemas/history/."
        )


# ------------------------------------------------- the checks check themselves


def _job_status_changed() -> dict[str, Any]:
    return copy.deepcopy(current_schema("JobStatusChanged"))


class TestTheChecksThemselves:
    def test_a_field_added_without_default_breaks_backward_and_is_named(self) -> None:
        """A new required field cannot be read from old frames; the fault names record and field."""
        new = _job_status_changed()
        new["fields"].append({"name": "cluster", "type": "string"})

        problems = compatibility_problems(new, current_schema("JobStatusChanged"))

        assert 1 == len(problems)
        assert problems[0].startswith("JobStatusChanged.cluster: reader_field_missing_default_value")

    def test_a_field_added_with_a_default_is_compatible_both_ways(self) -> None:
        """Adding a defaulted field keeps old and new readers working."""
        new = _job_status_changed()
        new["fields"].append({"name": "cluster", "type": "string", "default": "local"})

        assert [] == compatibility_problems(new, current_schema("JobStatusChanged"))
        assert [] == compatibility_problems(current_schema("JobStatusChanged"), new)

    def test_a_removed_required_field_breaks_forward_and_is_named(self) -> None:
        """Old readers need a field that has no default; dropping it is named as their fault."""
        new = _job_status_changed()
        new["fields"] = [f for f in new["fields"] if f["name"] != "attempt"]

        problems = compatibility_problems(current_schema("JobStatusChanged"), new)

        assert ["JobStatusChanged.attempt: reader_field_missing_default_value: attempt"] == problems

    def test_a_type_change_inside_a_union_record_names_the_nested_field(self) -> None:
        """A retyped CheckpointConfig field is named inside JobStatusChanged.config."""
        new = _job_status_changed()
        config = new["fields"][5]["type"][1]
        next(f for f in config["fields"] if f["name"] == "retained")["type"] = "string"

        problems = compatibility_problems(new, current_schema("JobStatusChanged"))

        assert problems[0].startswith(
            "JobStatusChanged.config<cutline.CheckpointConfig>: missing_union_branch"
        )
        assert any("CheckpointConfig.retained: type_mismatch" in p for p in problems[1:]), problems

    def test_a_type_change_inside_a_map_of_records_names_the_nested_field(self) -> None:
        """A retyped StateHandle field is named inside CheckpointCompleted.handles."""
        new = copy.deepcopy(current_schema("CheckpointCompleted"))
        handles = next(f for f in new["fields"] if f["name"] == "handles")
        handles["type"]["values"]["fields"][1]["type"] = "string"

        problems = compatibility_problems(new, current_schema("CheckpointCompleted"))

        found = [p.split("reader type")[0] for p in problems]
        assert any(p.startswith("CheckpointCompleted.handles{}.size_bytes: ") for p in found), found

    def test_an_enum_losing_a_symbol_breaks_backward(self) -> None:
        """A reader whose enum lacks a symbol the writer may send is incompatible."""
        new = _job_status_changed()
        new["fields"][1]["type"]["symbols"].remove("RECONCILING")

        problems = compatibility_problems(new, current_schema("JobStatusChanged"))

        assert ["JobStatusChanged.status (symbols): missing_enum_symbols: {'RECONCILING'}"] == problems

    def test_data_checks_pass_for_an_older_writer_and_fill_defaults(self) -> None:
        """An old JobStatusChanged vector passes both data checks once its schema is in the codec."""
        old = _job_status_changed()
        old["fields"] = [f for f in old["fields"] if "default" not in f]
        codec = Codec()
        fp = codec.registry.register_writer_schema(old)
        datum = {"job_id": "job-1", "status": "RUNNING", "timestamp_ms": 7, "attempt": 2, "tasks": ["t-0"]}
        body = io.BytesIO()
        schemaless_writer(body, old, datum)
        text = io.StringIO()
        json_writer(text, old, [datum])

        frame = MAGIC + fp + body.getvalue()

        assert [] == check_backward(codec, "old", frame, text.getvalue(), old)
        assert [] == check_forward(codec, "old", frame, text.getvalue(), old)

    def test_the_backward_data_check_asks_for_the_old_schema_in_history(self) -> None:
        """A frame whose schema the codec lacks fails with a message pointing at schemas/history/."""
        old = _job_status_changed()
        old["fields"] = [f for f in old["fields"] if "default" not in f]
        datum = {"job_id": "job-1", "status": "RUNNING", "timestamp_ms": 7, "attempt": 2, "tasks": []}
        body = io.BytesIO()
        schemaless_writer(body, old, datum)
        text = io.StringIO()
        json_writer(text, old, [datum])
        fp = schema_fingerprint(parse_schema(copy.deepcopy(old), _write_hint=False))

        problems = check_backward(Codec(), "old", MAGIC + fp + body.getvalue(), text.getvalue(), old)

        assert 1 == len(problems)
        assert "schemas/history/cutline.JobStatusChanged." in problems[0]

    def test_the_forward_data_check_reports_a_changed_value(self) -> None:
        """A value that does not survive the trip through the current schema is reported with its path."""
        assert ["x: JobStatusChanged.attempt: expected 2, got 3"] == _agree(
            {"job_id": "j", "attempt": 2, "gone": 1},
            {"job_id": "j", "attempt": 3, "gone": 0},
            {"job_id": "j", "attempt": 3},
            "x: JobStatusChanged",
        )

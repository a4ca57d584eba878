"""Avro binary bodies of cutline records, by encoders and decoders compiled once per schema.

Hand-written because fastavro interprets the schema on every call: ``schemaless_writer`` walks
the parsed schema dict and resolves every union by validating the datum against its branches,
and the record first has to become a dict (``codec.to_avro``). On the coordinator's hot path
(one ``CheckpointAcknowledged`` decoded and one ``TaskAcknowledged`` encoded per ack) that was a
large share of ``Coordinator.handle``. The functions compiled here (Python source generated from
the schema, like ``codec._compile_decoder``) do the same work without walking the schema
(docs/benchmarks.md).

The bytes are fastavro's, byte for byte (``tests/property/test_avro_binary.py`` checks every
record type against fastavro): zigzag varints for ``int`` and ``long``, length-prefixed UTF-8
strings and bytes, the branch index of a union, maps and arrays as one block (count, items,
then 0; nothing for an empty one), enums as the symbol's index, doubles little-endian.

Decoding reads only bodies written with the reader's own schema and gives exactly the datum
``fastavro.schemaless_reader`` gives (a dict per record, symbols as strings, lists). Anything it
does not expect (a short body, bad UTF-8, a varint beyond 64 bits, an ``int`` beyond 32 bits,
an unknown enum or union index, a map block with a negative count, a boolean byte other than 0
or 1) raises :class:`Unusual`, and the caller decodes that body with fastavro instead, which
then gives whatever fastavro gives or raises: odd input is judged exactly as before.
"""

from __future__ import annotations

import dataclasses
import struct
import typing
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any

from events.wire.codegen import compile_into

Encoder = Callable[[Any, bytes], bytes]
"""``(record, header)`` -> ``header`` followed by the record's Avro binary body."""

Decoder = Callable[[bytes, int], tuple[dict[str, Any], int]]
"""``(frame, start)`` -> the datum of the body starting at ``start``, and where it ends."""

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


_PRIMITIVES = frozenset({"int", "long", "string", "bytes", "boolean", "double"})
_SCALAR_KINDS = _PRIMITIVES | {"null"}


class Unusual(Exception):
    """A body the compiled decoder leaves to fastavro."""


class Unsupported(TypeError):
    """A schema this module does not compile (the caller keeps using fastavro for it)."""


# ------------------------------------------------------------------ encoding


def _zigzag_varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_SMALL_LONGS = tuple(_zigzag_varint(n) for n in range(8192))
"""The varints of 0 to 8191 (one or two bytes): sizes, lengths and counts, looked up."""


def _long(n: int) -> bytes | bytearray:
    """The zigzag varint of a 64-bit integer (fastavro raises OverflowError beyond 64 bits too)."""
    if 0 <= n < 8192:
        return _SMALL_LONGS[n]
    if not INT64_MIN <= n <= INT64_MAX:
        raise OverflowError(f"{n} does not fit in an Avro long")
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return out


def _as_int(value: Any) -> int:
    """What fastavro writes for a non-int in an ``int``/``long`` field: floats and bools truncated."""
    if isinstance(value, float):
        return int(value)
    if isinstance(value, bool):
        return int(value)
    return int(value.__index__())


def _union_int(value: Any) -> int:
    """A union picks its ``long`` branch only for an int that is not a bool (fastavro's validation)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    raise ValueError(f"{value!r} (type {type(value)}) does not match its union")


def _union_check(value: Any, kinds: tuple[type, ...]) -> None:
    if not isinstance(value, kinds):
        raise ValueError(f"{value!r} (type {type(value)}) does not match its union")


def _bad_enum(value: Any, symbols: list[str]) -> int:
    if value in symbols:
        return symbols.index(value)
    raise ValueError(f"{value!r} is not one of the symbols {symbols}")


class _Compiler:
    """Generates the source of one function per record class and type."""

    def __init__(self, named: dict[str, Any]) -> None:
        self.named = named
        self.namespace: dict[str, Any] = {
            "_long": _long,
            "_as_int": _as_int,
            "_union_int": _union_int,
            "_union_check": _union_check,
            "_bad_enum": _bad_enum,
            "_pack_double": struct.Struct("<d").pack,
            "_unpack_double": struct.Struct("<d").unpack_from,
            "_Unusual": Unusual,
            "_read_long": _read_long,
        }
        self.functions: dict[tuple[str, str, Any], str] = {}
        self.sources: list[str] = []
        self._n = 0

    def name(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def constant(self, value: Any) -> str:
        name = self.name("_c")
        self.namespace[name] = value
        return name

    def resolve(self, schema: Any) -> Any:
        if isinstance(schema, str) and schema in self.named:
            return self.named[schema]
        if isinstance(schema, dict) and schema.get("type") in ("record", "enum", "fixed"):
            self.named.setdefault(schema["name"], schema)
        if isinstance(schema, dict) and schema.get("type") == "record":
            for f in schema["fields"]:
                self._register(f["type"])
        return schema

    def _register(self, schema: Any) -> None:
        if isinstance(schema, list):
            for branch in schema:
                self._register(branch)
        elif isinstance(schema, dict):
            kind = schema.get("type")
            if kind in ("record", "enum", "fixed") and schema["name"] not in self.named:
                self.resolve(schema)
            elif kind == "array":
                self._register(schema["items"])
            elif kind == "map":
                self._register(schema["values"])

    def build(self) -> dict[str, Any]:
        compile_into("\n\n".join(self.sources), self.namespace)
        return self.namespace

    # ---------------------------------------------------------------- encoder

    def encoder(self, schema: dict[str, Any], cls: type) -> str:
        """The name of the function ``(record, out)`` appending ``cls``'s body to ``out``."""
        key = ("enc", schema["name"], cls)
        if key in self.functions:
            return self.functions[key]
        name = self.name("_enc")
        self.functions[key] = name
        hints = typing.get_type_hints(cls)
        lines = [f"def {name}(r, out):"]
        for f in schema["fields"]:
            var = self.name("v")
            lines.append(f"    {var} = r.{f['name']}")
            lines += self.encode(f["type"], var, hints.get(f["name"]), "    ")
        if len(lines) == 1:
            lines.append("    pass")
        self.sources.append("\n".join(lines))
        return name

    def encode(self, schema: Any, var: str, hint: Any, pad: str) -> list[str]:
        """Lines appending the encoding of the value in ``var`` to ``out``."""
        schema = self.resolve(schema)
        if isinstance(schema, list):
            return self._encode_union(schema, var, hint, pad)
        kind = schema if isinstance(schema, str) else schema["type"]
        if isinstance(schema, dict) and kind in _PRIMITIVES and set(schema) != {"type"}:
            raise Unsupported(f"annotated {kind} (logical types are not compiled)")
        if kind in _SCALAR_KINDS:
            return self._encode_scalar(kind, var, pad)
        if kind == "enum":
            return self._encode_enum(schema, var, hint, pad)
        if kind == "record":
            if not (isinstance(hint, type) and dataclasses.is_dataclass(hint)):
                raise Unsupported(f"record {schema['name']} without a dataclass")
            return [f"{pad}{self.encoder(schema, hint)}({var}, out)"]
        if kind in ("array", "map"):
            return self._encode_block(schema, kind == "map", var, hint, pad)
        raise Unsupported(f"Avro type {kind!r}")

    def _encode_scalar(self, kind: str, var: str, pad: str) -> list[str]:
        if kind in ("int", "long"):
            return [
                f"{pad}if type({var}) is not int: {var} = _as_int({var})",
                f"{pad}if 0 <= {var} < 64: out.append({var} << 1)",
                f"{pad}else: out += _long({var})",
            ]
        if kind in ("string", "bytes"):
            n = self.name("n")
            encoded = [f"{pad}{var} = {var}.encode()"] if kind == "string" else []
            return [
                *encoded,
                f"{pad}{n} = len({var})",
                f"{pad}if {n} < 64: out.append({n} << 1)",
                f"{pad}else: out += _long({n})",
                f"{pad}out += {var}",
            ]
        if kind == "boolean":
            return [f"{pad}out.append(1 if {var} else 0)"]
        if kind == "double":
            return [f"{pad}out += _pack_double({var})"]
        return [f"{pad}if {var} is not None: raise ValueError('a null field holds ' + repr({var}))"]

    def _encode_enum(self, schema: dict[str, Any], var: str, hint: Any, pad: str) -> list[str]:
        symbols = list(schema["symbols"])
        index: dict[Any, int] = {s: i for i, s in enumerate(symbols)}
        if isinstance(hint, type) and issubclass(hint, Enum):
            for member in hint:
                if member.value in index:
                    index[member] = index[member.value]
        table, names = self.constant(index), self.constant(symbols)
        i = self.name("i")
        return [
            f"{pad}{i} = {table}.get({var})",
            f"{pad}if {i} is None: {i} = _bad_enum({var}, {names})",
            f"{pad}out.append({i} << 1)",
        ]

    def _encode_block(self, schema: dict[str, Any], is_map: bool, var: str, hint: Any, pad: str) -> list[str]:
        """An array or a map: one block of all its items, then the empty block."""
        item_schema = schema["values"] if is_map else schema["items"]
        item_hint = _item_hint(hint, is_map)
        k, x, s, n = self.name("k"), self.name("x"), self.name("s"), self.name("n")
        lines = [
            f"{pad}if {var}:",
            f"{pad}    {n} = len({var})",
            f"{pad}    if {n} < 64: out.append({n} << 1)",
            f"{pad}    else: out += _long({n})",
        ]
        if is_map:
            lines += [
                f"{pad}    for {k}, {x} in {var}.items():",
                f"{pad}        if type({k}) is not str and not isinstance({k}, str):",
                f"{pad}            raise TypeError('a map key must be a string')",
                f"{pad}        {s} = {k}.encode()",
                f"{pad}        {n} = len({s})",
                f"{pad}        if {n} < 64: out.append({n} << 1)",
                f"{pad}        else: out += _long({n})",
                f"{pad}        out += {s}",
            ]
        else:
            lines.append(f"{pad}    for {x} in {var}:")
        lines += self.encode(item_schema, x, item_hint, pad + "        ")
        lines.append(f"{pad}out.append(0)")
        return lines

    def _encode_union(self, branches: list[Any], var: str, hint: Any, pad: str) -> list[str]:
        resolved = [self.resolve(b) for b in branches]
        kinds = [b if isinstance(b, str) else b["type"] for b in resolved]
        simple = ("int", "long", "string", "bytes", "boolean", "double", "enum", "record")
        if len(branches) != 2 or kinds[0] != "null" or kinds[1] not in simple:
            raise Unsupported(f"union {branches}")  # fastavro's pick of a branch is not copied
        inner_hint = _non_none(hint)
        branch, kind = resolved[1], kinds[1]
        lines = [f"{pad}if {var} is None:", f"{pad}    out.append(0)", f"{pad}else:"]
        inner = pad + "    "
        # fastavro picks a branch by validating the datum: the checks its validators make.
        if kind in ("int", "long"):
            lines.append(f"{inner}if type({var}) is not int: {var} = _union_int({var})")
            if kind == "int":
                lines.append(
                    f"{inner}if not {INT32_MIN} <= {var} <= {INT32_MAX}: "
                    f"raise ValueError('{{}} does not fit its int union'.format({var}))"
                )
        elif kind == "string":
            lines.append(f"{inner}if type({var}) is not str: _union_check({var}, (str,))")
        elif kind == "bytes":
            lines.append(f"{inner}if type({var}) is not bytes: _union_check({var}, (bytes, bytearray))")
        elif kind == "boolean":
            lines.append(f"{inner}if type({var}) is not bool: _union_check({var}, (bool,))")
        elif kind == "double":
            lines.append(f"{inner}_union_check({var}, (int, float))")
        lines.append(f"{inner}out.append(2)")
        lines += self.encode(branch, var, inner_hint, inner)
        return lines

    # ---------------------------------------------------------------- decoder

    def decoder(self, schema: dict[str, Any]) -> str:
        """The name of the function ``(b, p) -> (datum, p)`` reading one record of ``schema``."""
        key = ("dec", schema["name"], None)
        if key in self.functions:
            return self.functions[key]
        name = self.name("_dec")
        self.functions[key] = name
        lines = [f"def {name}(b, p):"]
        fields = []
        for f in schema["fields"]:
            var = self.name("v")
            lines += self.decode(f["type"], var, "    ")
            fields.append(f"{f['name']!r}: {var}")
        lines.append(f"    return {{{', '.join(fields)}}}, p")
        self.sources.append("\n".join(lines))
        return name

    def decode(self, schema: Any, var: str, pad: str) -> list[str]:
        """Lines reading one value of ``schema`` at ``p`` into ``var`` (and moving ``p`` past it)."""
        schema = self.resolve(schema)
        if isinstance(schema, list):
            return self._decode_union(schema, var, pad)
        kind = schema if isinstance(schema, str) else schema["type"]
        if isinstance(schema, dict) and kind in _PRIMITIVES and set(schema) != {"type"}:
            raise Unsupported(f"annotated {kind} (logical types are not compiled)")
        if kind in ("int", "long"):
            lines = self._varint(var, pad)
            if kind == "int":
                lines.append(f"{pad}if not {INT32_MIN} <= {var} <= {INT32_MAX}: raise _Unusual")
            return lines
        if kind in ("string", "bytes"):
            n = self.name("n")
            lines = self._varint(n, pad)
            lines += [
                f"{pad}if {n} < 0 or p + {n} > len(b): raise _Unusual",
                f"{pad}{var} = b[p:p + {n}]" + (".decode()" if kind == "string" else ""),
                f"{pad}p += {n}",
            ]
            if kind == "bytes":
                lines.append(f"{pad}{var} = bytes({var})")
            return lines
        if kind == "boolean":
            return [
                f"{pad}{var} = b[p]",
                f"{pad}if {var} > 1: raise _Unusual",
                f"{pad}{var} = {var} == 1",
                f"{pad}p += 1",
            ]
        if kind == "double":
            return [f"{pad}({var},) = _unpack_double(b, p)", f"{pad}p += 8"]
        if kind == "null":
            return [f"{pad}{var} = None"]
        if kind == "enum":
            symbols = self.constant(tuple(schema["symbols"]))
            return [
                *self._varint(var, pad),
                f"{pad}if not 0 <= {var} < {len(schema['symbols'])}: raise _Unusual",
                f"{pad}{var} = {symbols}[{var}]",
            ]
        if kind == "record":
            return [f"{pad}{var}, p = {self.decoder(schema)}(b, p)"]
        if kind in ("array", "map"):
            is_map = kind == "map"
            item_schema = schema["values"] if is_map else schema["items"]
            n, k, x = self.name("n"), self.name("k"), self.name("x")
            lines = [f"{pad}{var} = {{}}" if is_map else f"{pad}{var} = []"]
            lines += self._varint(n, pad)
            lines += [
                f"{pad}while {n}:",
                f"{pad}    if {n} < 0: raise _Unusual",
                f"{pad}    for _ in range({n}):",
            ]
            inner = pad + "        "
            if is_map:
                lines += self.decode("string", k, inner)
            lines += self.decode(item_schema, x, inner)
            lines.append(f"{inner}{var}[{k}] = {x}" if is_map else f"{inner}{var}.append({x})")
            lines += self._varint(n, pad + "    ")
            return lines
        raise Unsupported(f"Avro type {kind!r}")

    def _decode_union(self, branches: list[Any], var: str, pad: str) -> list[str]:
        index = self.name("u")
        lines = self._varint(index, pad)
        for i, branch in enumerate(branches):
            lines.append(f"{pad}{'if' if i == 0 else 'elif'} {index} == {i}:")
            lines += self.decode(branch, var, pad + "    ")
        lines.append(f"{pad}else: raise _Unusual")
        return lines

    def _varint(self, var: str, pad: str) -> list[str]:
        """Lines reading a zigzag varint into ``var``: one byte inline, longer ones by a call."""
        return [
            f"{pad}{var} = b[p]",
            f"{pad}if {var} < 0x80:",
            f"{pad}    {var} = ({var} >> 1) ^ -({var} & 1)",
            f"{pad}    p += 1",
            f"{pad}elif b[p + 1] < 0x80:",
            f"{pad}    {var} = ({var} & 0x7F) | (b[p + 1] << 7)",
            f"{pad}    {var} = ({var} >> 1) ^ -({var} & 1)",
            f"{pad}    p += 2",
            f"{pad}else:",
            f"{pad}    {var}, p = _read_long(b, p)",
        ]


def _read_long(b: bytes, p: int) -> tuple[int, int]:
    """A zigzag varint of at most 10 bytes whose value fits in 64 bits (else :class:`Unusual`)."""
    n = 0
    shift = 0
    byte = 0x80
    while byte & 0x80:
        if shift > 63:
            raise Unusual
        byte = b[p]
        n |= (byte & 0x7F) << shift
        p += 1
        shift += 7
    if n >> 64:
        raise Unusual
    return (n >> 1) ^ -(n & 1), p


read_long = _read_long
"""A zigzag varint at ``p`` of ``b`` and the position after it (:class:`Unusual` beyond 64 bits)."""

long_bytes = _long
"""The zigzag varint of a 64-bit integer."""


def _non_none(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if len(args) == 1 else hint


def _item_hint(hint: Any, is_map: bool) -> Any:
    args = typing.get_args(hint)
    if not args:
        return None
    return args[1] if is_map else args[0]


# ------------------------------------------------------------------- entries


def compile_encoder(schema: Mapping[str, Any], cls: type) -> Encoder:
    """The body encoder of ``cls`` records under ``schema`` (parsed, named types inlined at their
    first use, as ``fastavro.schema.load_schema`` gives them). Raises :class:`Unsupported`."""
    compiler = _Compiler({})
    root = dict(schema)
    compiler.resolve(root)
    name = compiler.encoder(root, cls)
    source = [
        "def encode(r, header=b''):",
        "    out = bytearray(header)",
        "    try:",
        f"        {name}(r, out)",
        "    except AttributeError as exc:",
        "        raise TypeError(f'not a valid {r!r}: {exc}') from exc",
        "    return bytes(out)",
    ]
    compiler.sources.append("\n".join(source))
    return typing.cast(Encoder, compiler.build()["encode"])


def compile_decoder(schema: Mapping[str, Any]) -> Decoder:
    """The body decoder of ``schema``, read with itself as the reader schema: ``(b, p)`` -> the
    datum fastavro would give and the end of the body; :class:`Unusual` for whatever it leaves to
    fastavro. Raises :class:`Unsupported` for a schema it does not compile."""
    compiler = _Compiler({})
    root = dict(schema)
    compiler.resolve(root)
    name = compiler.decoder(root)
    source = [
        "def decode(b, p):",
        "    try:",
        f"        return {name}(b, p)",
        "    except _Unusual:",
        "        raise",
        "    except Exception as exc:",  # short bodies (IndexError), bad UTF-8, ...
        "        raise _Unusual from exc",
    ]
    compiler.sources.append("\n".join(source))
    return typing.cast(Decoder, compiler.build()["decode"])

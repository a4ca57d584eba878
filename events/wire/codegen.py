"""Every piece of generated code in cutline, and the one ``exec`` that compiles it.

Hot paths build instances of frozen dataclasses millions of times (replay, the ack path), and
a frozen dataclass's own ``__init__`` and ``dataclasses.replace`` set each field through
``object.__setattr__``, a full call per field. The generators here write, once per class, code
that sets the slots (or the instance dict) directly, leaving exactly what the dataclass's own
methods would:

- :func:`fast_init`: an ``__init__`` for the frozen, slotted dataclasses made once per input;
- :func:`replacer`: ``dataclasses.replace`` for one class (``evolve`` runs once per event);
- :func:`slot_setters`: the slot descriptors a generated constructor calls, shared by the
  record decoders of :mod:`events.wire.codec`;
- :func:`compile_into` (the only ``exec``) and :func:`define`, used by the above and by the
  Avro schema compiler of :mod:`events.wire.avro_binary` (encoders and decoders from our schemas).

Nothing here compiles text that came from input: the sources are built from a class's own
field names or from the schemas in ``schemas/``. Tests: ``tests/unit/test_codegen.py``.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from collections.abc import Callable
from typing import Any, TypeVar, cast

__all__ = ["compile_into", "define", "fast_init", "replacer", "slot_setters"]


def compile_into(source: str, namespace: dict[str, Any]) -> None:
    """Run the definitions of ``source`` in ``namespace`` (the schema compiler defines many
    functions at once). The only ``exec`` of cutline."""
    exec(source, namespace)  # noqa: S102 - every source is built from classes and our own schemas


def define(name: str, source: str, namespace: dict[str, Any]) -> Any:
    """Compile ``source`` in ``namespace`` and give what it defines as ``name``."""
    compile_into(source, namespace)
    return namespace[name]


def slot_setters(cls: type, names: list[str]) -> list[Callable[[Any, Any], None]] | None:
    """The ``__set__`` of each slot ``names`` of ``cls``, or None when one of them is not a slot."""
    slots = [getattr(cls, n, None) for n in names]
    if not all(isinstance(slot, types.MemberDescriptorType) for slot in slots):
        return None
    return [slot.__set__ for slot in slots]  # type: ignore[union-attr]


_C = TypeVar("_C", bound=type)


class _Factory:
    """Stands for a field's ``default_factory`` in the signature (the dataclass's own sentinel is
    private); shown as the dataclass shows it."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY: Any = _Factory()


def fast_init(cls: _C) -> _C:
    """Give the frozen, slotted dataclass ``cls`` an ``__init__`` that sets its slots directly.

    Apply it above ``@dataclass(frozen=True, slots=True)``. Refuses (``TypeError``) a class it
    could not keep exact for: one without slots, with ``__post_init__``, or with a field that is
    ``init=False``, keyword-only or init-only (``InitVar``), or named ``self`` or ``_fast_*``
    (the names the generated code uses). The dataclass's own ``__init__`` stays at
    ``cls.__init__.dataclass_init`` (tests compare the two)."""
    if not dataclasses.is_dataclass(cls) or not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise TypeError(f"fast_init is for frozen dataclasses; {cls.__name__} is not one")
    fields = dataclasses.fields(cls)
    slots = [cls.__dict__.get(f.name) for f in fields]
    if not all(isinstance(slot, types.MemberDescriptorType) for slot in slots):
        raise TypeError(f"fast_init needs slots (@dataclass(..., slots=True)) on {cls.__name__}")
    dataclass_parameters = list(inspect.signature(cls.__init__).parameters)[1:]
    if (
        hasattr(cls, "__post_init__")
        or any(not f.init or f.kw_only or f.name == "self" or f.name.startswith("_fast_") for f in fields)
        or dataclass_parameters != [f.name for f in fields]  # an InitVar, say
    ):
        raise TypeError(
            f"fast_init keeps only plain fields exact; {cls.__name__} has __post_init__, an init=False, "
            "keyword-only or init-only field, or a field named self or _fast_*"
        )
    namespace: dict[str, Any] = {"_fast_factory": _FACTORY}
    parameters, lines = [], []
    for i, (f, slot) in enumerate(zip(fields, slots, strict=True)):
        namespace[f"_fast_set{i}"] = slot.__set__  # type: ignore[union-attr]
        value = f.name
        if f.default is not dataclasses.MISSING:
            namespace[f"_fast_default{i}"] = f.default
            parameters.append(f"{f.name}=_fast_default{i}")
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f"_fast_factory{i}"] = f.default_factory
            parameters.append(f"{f.name}=_fast_factory")
            value = f"_fast_factory{i}() if {f.name} is _fast_factory else {f.name}"
        else:
            parameters.append(f.name)
        lines.append(f"    _fast_set{i}(self, {value})")
    source = f"def __init__(self, {', '.join(parameters)}):\n" + "\n".join(lines or ["    pass"])
    init = define("__init__", source, namespace)
    original = cls.__init__
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__annotations__ = dict(original.__annotations__)
    init.__doc__ = original.__doc__
    init.dataclass_init = original
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


_T = TypeVar("_T")
_KEEP: Any = object()


def replacer(cls: type[_T]) -> Callable[..., _T]:
    """``dataclasses.replace`` for one dataclass, compiled from its fields.

    ``evolve`` runs once per journal event (millions in a replay), and the
    generic ``replace`` walks every field through ``getattr``, a kwargs dict and
    the frozen ``__init__`` (one ``object.__setattr__`` per field). For a slotted
    class without ``__post_init__`` this sets the slots directly, which leaves
    exactly what ``__init__`` would; about three times as fast for ``JobState``.
    """
    cls_fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    names = [f.name for f in cls_fields if f.init]
    params = ", ".join(f"{n}=_KEEP" for n in names)
    values = [f"s.{n} if {n} is _KEEP else {n}" for n in names]
    namespace: dict[str, Any] = {"_KEEP": _KEEP, "_cls": cls, "_new": object.__new__}
    slots = [getattr(cls, n, None) for n in names]
    plain = len(names) == len(cls_fields) and not hasattr(cls, "__post_init__")
    if plain and "__slots__" not in cls.__dict__:
        # A wide class without slots (JobState, the statistics): copy the instance's dict in one
        # call, then the changed fields, instead of one slot at a time (cheaper for JobState's
        # many fields, and an ack replaces it once).
        lines = ["    o = _new(_cls)", "    d = o.__dict__", "    d.update(s.__dict__)"]
        lines += [f"    if {n} is not _KEEP: d[{n!r}] = {n}" for n in names]
        body = "\n".join([*lines, "    return o"])
    elif (
        len(names) == len(cls_fields)
        and not hasattr(cls, "__post_init__")
        and all(isinstance(slot, types.MemberDescriptorType) for slot in slots)
    ):
        lines = ["    o = _new(_cls)"]
        for i, (slot, value) in enumerate(zip(slots, values, strict=True)):
            namespace[f"_set{i}"] = slot.__set__  # type: ignore[union-attr]
            lines.append(f"    _set{i}(o, {value})")
        body = "\n".join([*lines, "    return o"])
    else:
        body = f"    return _cls({', '.join(f'{n}={v}' for n, v in zip(names, values, strict=True))})"
    return cast(Callable[..., _T], define("replace", f"def replace(s, *, {params}):\n{body}", namespace))

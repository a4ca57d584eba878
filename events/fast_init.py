"""A faster ``__init__`` for the frozen, slotted dataclasses made once per input (an ack's command,
its journal event, its outgoing message, its parsed state URI).

A frozen dataclass's generated ``__init__`` sets each field with ``object.__setattr__`` (its own
``__setattr__`` refuses), a full method call per field. :func:`fast_init` gives the class
an ``__init__`` with the same signature that calls each slot's descriptor instead, as
:func:`events.codec.avro_decoder` and :func:`coordinator.state.replacer` already build instances:
what it leaves is exactly what the dataclass's ``__init__`` would (the instance stays frozen), in
noticeably less time on the ack path (docs/benchmarks.md). Written here rather than taken from a
library: attrs and dataclasses both set frozen fields through ``object.__setattr__``.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from typing import Any, TypeVar

_T = TypeVar("_T", bound=type)


class _Factory:
    """Stands for a field's ``default_factory`` in the signature (the dataclass's own sentinel is
    private); shown as the dataclass shows it."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY: Any = _Factory()


def fast_init(cls: _T) -> _T:
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
    exec(source, namespace)  # noqa: S102 - built above from the class's own field names
    init = namespace["__init__"]
    original = cls.__init__
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__annotations__ = dict(original.__annotations__)
    init.__doc__ = original.__doc__
    init.dataclass_init = original
    cls.__init__ = init  # type: ignore[method-assign]
    return cls

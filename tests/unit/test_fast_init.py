"""``fast_init`` (events/fast_init.py): an instance it makes is the one the dataclass's ``__init__`` makes.

Checked on every class that uses it (the modules that apply it are scanned, so a class added to
one of them is not left out; a module that starts applying it goes into ``SCANNED``) and on
sample classes with each kind of field it accepts; and it refuses the classes it could not keep
exact for.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import coordinator.commands
import coordinator.service.runtime
import events.records
import events.validation
from events.codegen import fast_init

SCANNED = (events.records, events.validation, coordinator.commands, coordinator.service.runtime)
USERS = sorted(
    {
        cls
        for module in SCANNED
        for cls in vars(module).values()
        if isinstance(cls, type) and hasattr(cls.__init__, "dataclass_init")
    },
    key=lambda cls: cls.__qualname__,
)


def made_both_ways(cls: type, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """``cls(*args, **kwargs)``, and the same made by the dataclass's own ``__init__``."""
    fast = cls(*args, **kwargs)
    reference = object.__new__(cls)
    cls.__init__.dataclass_init(reference, *args, **kwargs)  # type: ignore[misc]
    return fast, reference


def field_values(instance: Any) -> list[Any]:
    return [getattr(instance, f.name) for f in dataclasses.fields(instance)]


def test_the_classes_made_once_per_ack_use_it() -> None:
    names = {cls.__name__ for cls in USERS}
    assert {"TaskAcknowledged", "AcknowledgeCheckpoint", "Outgoing", "StorageUri"} <= names


@pytest.mark.parametrize("cls", USERS, ids=lambda cls: cls.__name__)
class TestEveryUser:
    def test_the_signature_is_the_dataclasss(self, cls: type) -> None:
        fast = inspect.signature(cls.__init__)
        reference = inspect.signature(cls.__init__.dataclass_init)  # type: ignore[misc]
        assert [(p.name, p.kind, p.annotation) for p in fast.parameters.values()] == [
            (p.name, p.kind, p.annotation) for p in reference.parameters.values()
        ]
        assert [repr(p.default) for p in fast.parameters.values()] == [
            repr(p.default) for p in reference.parameters.values()
        ]

    def test_every_field_holds_the_object_given_for_it(self, cls: type) -> None:
        given_values = [object() for _ in dataclasses.fields(cls)]  # no init checks types: any object
        by_position, reference = made_both_ways(cls, *given_values)
        by_name, _ = made_both_ways(
            cls, **{f.name: v for f, v in zip(dataclasses.fields(cls), given_values, strict=True)}
        )
        for made in (by_position, by_name, reference):
            assert all(a is b for a, b in zip(field_values(made), given_values, strict=True))
        assert by_position == reference == by_name
        assert hash(by_position) == hash(reference)

    def test_defaults_are_the_dataclasss(self, cls: type) -> None:
        required = {
            f.name: object()
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        fast, reference = made_both_ways(cls, **required)
        assert field_values(fast) == field_values(reference)
        for f, value in zip(dataclasses.fields(cls), field_values(fast), strict=True):
            if f.default_factory is not dataclasses.MISSING:
                assert value == f.default_factory() and value is not getattr(cls(**required), f.name)

    def test_the_instance_stays_frozen(self, cls: type) -> None:
        instance = cls(*[object() for _ in dataclasses.fields(cls)])
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(instance, dataclasses.fields(cls)[0].name, 1)

    def test_wrong_calls_fail_as_they_did(self, cls: type) -> None:
        with pytest.raises(TypeError):
            cls(*[object() for _ in range(len(dataclasses.fields(cls)) + 1)])
        with pytest.raises(TypeError):
            cls(no_such_field=1)


@fast_init
@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    count: int = 3
    items: tuple[int, ...] = ()
    labels: dict[str, int] = field(default_factory=dict)


@given(
    name=st.text(max_size=5),
    count=st.integers(),
    items=st.lists(st.integers(), max_size=3).map(tuple),
    labels=st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    fields_given=st.integers(min_value=1, max_value=4),
    by_name=st.booleans(),
)
def test_any_call_of_a_sample_makes_what_the_dataclass_makes(
    name: str, count: int, items: tuple[int, ...], labels: dict[str, int], fields_given: int, by_name: bool
) -> None:
    # Given the first ``fields_given`` fields, by position or by name (the rest left to defaults)
    drawn = [("name", name), ("count", count), ("items", items), ("labels", labels)]
    values = dict(drawn[:fields_given])
    args, kwargs = ((), values) if by_name else (tuple(values.values()), {})
    # When made with fast_init's __init__ and with the dataclass's
    fast, reference = made_both_ways(Sample, *args, **kwargs)
    # Then the two are the same, field by field
    assert field_values(fast) == field_values(reference)
    assert fast == reference


def test_a_factory_default_is_new_for_each_instance() -> None:
    first, second = Sample("a"), Sample("b")
    assert first.labels == {} and first.labels is not second.labels


@pytest.mark.parametrize(
    "declare",
    [
        lambda: dataclass(frozen=True)(type("NoSlots", (), {"__annotations__": {"a": "int"}})),
        lambda: dataclass(slots=True)(type("NotFrozen", (), {"__annotations__": {"a": "int"}})),
        lambda: dataclass(frozen=True, slots=True)(
            type("PostInit", (), {"__annotations__": {"a": "int"}, "__post_init__": lambda self: None})
        ),
        lambda: dataclass(frozen=True, slots=True)(
            type("NotInInit", (), {"__annotations__": {"a": "int"}, "a": field(init=False, default=1)})
        ),
        lambda: dataclass(frozen=True, slots=True, kw_only=True)(
            type("KeywordOnly", (), {"__annotations__": {"a": "int"}})
        ),
        lambda: dataclass(frozen=True, slots=True)(
            type("InitOnly", (), {"__annotations__": {"a": int, "b": dataclasses.InitVar[int]}})
        ),
        lambda: dataclass(frozen=True, slots=True)(type("SelfNamed", (), {"__annotations__": {"self": int}})),
        lambda: dataclass(frozen=True, slots=True)(
            type("Clash", (), {"__annotations__": {"_fast_set0": int}})
        ),
        lambda: type("NotADataclass", (), {}),
    ],
    ids=[
        "no slots",
        "not frozen",
        "__post_init__",
        "init=False",
        "keyword-only",
        "InitVar",
        "a field named self",
        "a field named as the generated code's names",
        "not a dataclass",
    ],
)
def test_it_refuses_a_class_it_could_not_keep_exact_for(declare: Any) -> None:
    declared = declare()  # declared outside the check: only fast_init may raise
    with pytest.raises(TypeError, match="fast_init"):
        fast_init(declared)

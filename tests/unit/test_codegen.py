"""The generated code of ``events/wire/codegen.py``, each generator against what it stands in for.

``fast_init``: an instance it makes is the one the dataclass's ``__init__`` makes. Checked on
every class that uses it (the modules that apply it are scanned, so a class added to
one of them is not left out; a module that starts applying it goes into ``SCANNED``) and on
sample classes with each kind of field it accepts; and it refuses the classes it could not keep
exact for.

``replacer``: what ``dataclasses.replace`` gives, for each shape of class it compiles for (a
wide class without slots, a slotted one, one with ``__post_init__``), on the state classes.

The record decoders (``events.wire.codec.avro_decoder``) and the Avro schema compiler
(``events.wire.avro_binary``) are compiled through ``define``/``compile_into`` too: their round
trips are ``tests/unit/test_codec.py``; here, that they give what the generic path gives.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import coordinator.core.commands
import coordinator.service.runtime
import events.wire.records
import events.wire.validation
from coordinator.core.state import JobState, PendingCheckpoint, Scheduler, pending_checkpoint, with_tasks
from coordinator.core.testing import run_commands, running, tick
from events.wire.codec import _from_avro_fields, avro_decoder, to_avro
from events.wire.codegen import compile_into, define, fast_init, replacer, slot_setters
from events.wire.records import CheckpointConfig, CheckpointTriggered, StateHandle

SCANNED = (
    events.wire.records,
    events.wire.validation,
    coordinator.core.commands,
    coordinator.service.runtime,
)
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


# ------------------------------------------------------------------ define, compile_into


def test_define_gives_the_named_definition_and_keeps_the_others() -> None:
    """``define`` returns the function named; every other definition stays in the namespace."""
    namespace: dict[str, Any] = {"k": 3}

    triple = define(
        "triple", "def helper(x):\n    return k * x\n\ndef triple(x):\n    return helper(x)", namespace
    )

    assert 12 == triple(4)
    assert "helper" in namespace


def test_compile_into_defines_many_functions_at_once() -> None:
    """The schema compiler's use: a batch of sources, each function seeing the others."""
    namespace: dict[str, Any] = {}

    compile_into("def a():\n    return b()\n\ndef b():\n    return 'b'", namespace)

    assert "b" == namespace["a"]()


def test_slot_setters_only_for_slots() -> None:
    """Setters of a slotted class's fields; None when one of the names is no slot."""
    assert slot_setters(Scheduler, ["next_trigger_ms"]) is not None
    assert slot_setters(JobState, ["job_id"]) is None


# ------------------------------------------------------------------ replacer


@dataclass(frozen=True)
class _Posted:
    a: int
    b: int = 0

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError("a must not be negative")


def _busy() -> JobState:
    state, _ = run_commands([running(at=0), tick(1000), tick(2000)])
    return state


@pytest.mark.parametrize(
    ("instance", "changes"),
    [
        pytest.param(_busy(), {"attempt": 7, "failures": 2}, id="JobState, no slots"),
        pytest.param(_busy(), {}, id="JobState, nothing changed"),
        pytest.param(Scheduler(5), {"next_trigger_ms": None}, id="Scheduler, slots"),
        pytest.param(_busy().pending[1], {"acks": _busy().pending[1].acks}, id="PendingCheckpoint, kw-only"),
        pytest.param(_Posted(1, 2), {"b": 5}, id="__post_init__"),
    ],
)
def test_a_replacer_gives_what_dataclasses_replace_gives(instance: Any, changes: dict[str, Any]) -> None:
    """Equal, of the same type, field by field identical values, and the original left as it was."""
    before = field_values(instance)

    replaced = replacer(type(instance))(instance, **changes)
    expected = dataclasses.replace(instance, **changes)

    assert type(expected) is type(replaced)
    assert field_values(expected) == field_values(replaced)
    assert before == field_values(instance)


def test_a_replacer_runs_post_init() -> None:
    """A class with ``__post_init__`` goes through its ``__init__``, so its checks still run."""
    with pytest.raises(ValueError, match="negative"):
        replacer(_Posted)(_Posted(1), a=-1)


def test_state_helpers_build_the_task_sets() -> None:
    """``with_tasks`` and ``pending_checkpoint`` set the derived task sets from the tasks."""
    state = JobState("j", **with_tasks(("a", "b")))
    triggered = CheckpointTriggered(
        "j", 1, 1, _busy().pending[1].triggered.kind, 0, "file:///x/j/chk-1", ("a",), 9
    )

    assert frozenset({"a", "b"}) == state.task_ids
    assert PendingCheckpoint(triggered, task_ids=frozenset({"a"})) == pending_checkpoint(triggered)


# ------------------------------------------------------------------ record decoders


@pytest.mark.parametrize(
    "record",
    [
        pytest.param(CheckpointConfig(interval_ms=5, location="file:///x"), id="CheckpointConfig"),
        pytest.param(StateHandle("file:///x/a", 3, "ab" * 32, b"abc"), id="StateHandle"),
        pytest.param(_busy().pending[1].triggered, id="CheckpointTriggered"),
    ],
)
def test_a_compiled_decoder_gives_what_the_field_by_field_path_gives(record: Any) -> None:
    """``avro_decoder`` (generated) and ``_from_avro_fields`` (generic) agree on a record's datum."""
    datum = to_avro(record)

    assert field_values(_from_avro_fields(type(record), datum)) == field_values(
        avro_decoder(type(record))(datum)
    )
    assert record == avro_decoder(type(record))(datum)

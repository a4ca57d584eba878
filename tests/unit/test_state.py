"""The job state's persistent maps, and its JSON."""

from __future__ import annotations

import json
import random
from dataclasses import asdict, replace
from itertools import islice
from typing import Any

from coordinator.core.decider import evolve
from coordinator.core.state import JobState, frozen_map, initial_state, state_json
from coordinator.simulation.traffic import Rates, simulate


def thawed(state: JobState) -> JobState:
    """``state`` with plain dicts where it has frozen maps: what the state held before them."""
    pending = {cid: replace(p, acks=dict(p.acks)) for cid, p in state.pending.items()}
    return replace(
        state,
        pending=pending,  # type: ignore[arg-type]
        tasks_not_running=dict(state.tasks_not_running),  # type: ignore[arg-type]
    )


def json_as_before(state: JobState) -> dict[str, Any]:
    """``state_json`` as it was written before the frozen maps: ``asdict`` through JSON."""
    before = asdict(thawed(state))
    before.pop("task_ids")  # derived from the tasks, and not shown
    for pending in before["pending"].values():
        pending.pop("task_ids")
    result: dict[str, Any] = json.loads(json.dumps(before, sort_keys=True))
    return result


class TestFrozenMap:
    def test_built_from_a_mapping_or_pairs(self) -> None:
        """``frozen_map`` takes a mapping or key-value pairs, and nothing gives an empty map."""
        assert (
            {"a": 1, "b": 2} == dict(frozen_map({"a": 1, "b": 2})) == dict(frozen_map([("a", 1), ("b", 2)]))
        )
        assert 0 == len(frozen_map())

    def test_set_leaves_the_old_map_as_it_was(self) -> None:
        """Setting a key returns a new map; the one it came from keeps its items."""
        old = frozen_map({"a": 1})

        new = old.set("b", 2)

        assert ({"a": 1}, {"a": 1, "b": 2}) == (dict(old), dict(new))

    def test_equal_by_items_whatever_the_order_of_insertion(self) -> None:
        """Two maps with the same items are equal, as two dicts would be."""
        assert frozen_map({"a": 1, "b": 2}) == frozen_map({"b": 2}).set("a", 1)


class TestStateJson:
    def test_same_json_as_before_the_frozen_maps(self) -> None:
        """Along a simulated journal, ``state_json`` gives exactly what ``asdict`` gave on dicts."""
        rates = Rates(task_failure=0.2)  # tasks that are not RUNNING, now and then
        states: dict[str, JobState] = {}
        seen_acks = seen_not_running = False
        for i, event in enumerate(islice(simulate(random.Random(7), jobs=3, rates=rates), 6000)):
            state = evolve(states.get(event.job_id) or initial_state(event.job_id), event)
            states[event.job_id] = state
            if i % 3 == 0:
                assert json_as_before(state) == state_json(state)
                seen_acks |= any(p.acks for p in state.pending.values())
                seen_not_running |= bool(state.tasks_not_running)

        assert (True, True) == (seen_acks, seen_not_running)

    def test_plain_json_data(self) -> None:
        """The maps become JSON objects (checkpoint ids as string keys), not opaque values."""
        state = initial_state("job")

        assert {} == state_json(state)["pending"] == state_json(state)["tasks_not_running"]
        assert json.loads(json.dumps(state_json(state))) == state_json(state)

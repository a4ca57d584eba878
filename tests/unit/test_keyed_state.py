"""Keyed state without Spark: key groups, the state store, incremental snapshots and rescaling."""

from __future__ import annotations

import hashlib
import json
import random
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyarrow")
pytest.importorskip("mmh3")

from events.task.manifest import StepIdentity  # noqa: E402
from events.task.participant import SnapshotCorrupted  # noqa: E402
from events.wire.records import StateHandle  # noqa: E402
from spark_tasks.keyed import (  # noqa: E402
    FULL_EVERY,
    MAX_CHAIN,
    KeyedSettings,
    KeyedState,
    KeyedStateStore,
    Manifest,
    apply_changes,
    decode_piece,
    encode_piece,
    key_group,
    key_group_range,
    keyed_task_id,
    operator_index,
    read_keyed_state,
    write_snapshot,
)
from spark_tasks.state import StateLost  # noqa: E402

STEP = StepIdentity("counts", "tests.words_of")


def partitioned(
    state_by_key: dict[str, bytes], parallelism: int, max_parallelism: int = 128
) -> list[KeyedState]:
    """``state_by_key`` split into the key groups of ``parallelism`` partitions."""
    parts: list[KeyedState] = [{} for _ in range(parallelism)]
    for key, value in state_by_key.items():
        group = key_group(key, max_parallelism)
        parts[operator_index(group, parallelism, max_parallelism)].setdefault(group, {})[key] = value
    return parts


def settings_for(tmp: Path, parallelism: int) -> KeyedSettings:
    return KeyedSettings(
        job_id="keyed",
        bootstrap="unused:9092",
        state_root=str(tmp / "state"),
        parallelism=parallelism,
        inputs=frozenset({("words", 0)}),
        run_id="r1",
        attempt=1,
    )


def barrier(location: str, checkpoint_id: int, kind: str = "CHECKPOINT") -> dict[str, object]:
    return {"id": checkpoint_id, "attempt": 1, "kind": kind, "location": location, "timestamp_ms": 0}


def handle_of(uri: str, data: bytes) -> StateHandle:
    return StateHandle(uri, len(data), hashlib.sha256(data).hexdigest())


# ------------------------------------------------------------------ key groups


@settings(deadline=None)  # 32768 key groups take a few hundred ms on a busy machine
@given(st.integers(1, 128), st.sampled_from([128, 256, 32768]))
def test_the_partitions_own_every_key_group_exactly_once_in_contiguous_ranges(
    parallelism: int, max_p: int
) -> None:
    ranges = [key_group_range(i, parallelism, max_p) for i in range(parallelism)]
    assert [g for r in ranges for g in r] == list(range(max_p))
    for index, owned in enumerate(ranges):
        assert all(operator_index(group, parallelism, max_p) == index for group in owned)


@given(st.text(max_size=30))
def test_a_key_always_lands_in_the_same_key_group(key: str) -> None:
    assert key_group(key) == key_group(key) and 0 <= key_group(key) < 128


def test_key_groups_are_murmur3_of_the_utf8_key() -> None:
    # mmh3.hash(b"hello", 0, signed=False) == 613153351, a published murmur3_x86_32 vector
    assert key_group("hello") == 613153351 % 128


def test_more_partitions_than_key_groups_is_refused() -> None:
    with pytest.raises(ValueError, match="max parallelism"):
        key_group_range(0, 129, 128)


# ---------------------------------------------------------------------- pieces


@settings(deadline=None)  # the first Arrow IPC stream of a process takes a second to set up
@given(st.dictionaries(st.integers(0, 127), st.dictionaries(st.text(), st.none() | st.binary()), max_size=5))
def test_a_piece_decodes_to_what_was_encoded(changes: dict[int, dict[str, bytes | None]]) -> None:
    expected = {group: keys for group, keys in changes.items() if keys}
    assert decode_piece(encode_piece(changes)) == expected


def test_folding_deltas_deletes_keys_whose_state_is_null() -> None:
    state: KeyedState = {1: {"a": b"1", "b": b"2"}}
    apply_changes(state, {1: {"a": None}, 2: {"c": b"3"}})
    assert state == {1: {"b": b"2"}, 2: {"c": b"3"}}
    apply_changes(state, {1: {"b": None}})
    assert state == {2: {"c": b"3"}}


# ----------------------------------------------------------------- state store


@pytest.fixture(params=["file", "memory"])
def store_root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        pytest.importorskip("fsspec")
        return f"memory://cutline-test-{uuid.uuid4().hex}"
    return str(tmp_path / "store")


def test_the_store_gives_back_the_state_before_any_batch_also_after_pruning(store_root: str) -> None:
    """Given a partition folded over 3 * FULL_EVERY batches, when any recent batch is re-run, it
    loads exactly the state before that batch (deltas on fulls), and pruning kept what it needs."""
    store = KeyedStateStore(store_root, 0)
    store.seed({})
    truth: list[KeyedState] = [{}]  # truth[b] = state before batch b
    rng = random.Random(1)
    state: KeyedState = {}
    for batch in range(3 * FULL_EVERY):
        changes: dict[int, dict[str, bytes | None]] = {}
        for _ in range(rng.randrange(0, 5)):
            key = f"k{rng.randrange(30)}"
            group = key_group(key)
            changes.setdefault(group, {})[key] = None if rng.random() < 0.2 else str(rng.random()).encode()
        apply_changes(state, changes)
        store.save(batch + 1, state, changes)
        truth.append({g: dict(k) for g, k in state.items()})
    fresh = KeyedStateStore(store_root, 0)
    for batch in range(2 * FULL_EVERY, 3 * FULL_EVERY + 1):
        from spark_tasks import keyed

        keyed._cache.clear()  # read from the files, as another Python worker would
        assert fresh.load(batch) == truth[batch], batch
    assert min(store.versions()) > 0  # old versions were pruned


def test_a_tombstone_makes_every_later_load_fail(store_root: str) -> None:
    store = KeyedStateStore(store_root, 3)
    store.seed({5: {"a": b"1"}})
    store.lost(4, "gone")
    assert store.load(3) == {5: {"a": b"1"}}
    with pytest.raises(StateLost, match="gone"):
        store.load(7)


def test_a_store_without_versions_has_no_state(store_root: str) -> None:
    assert KeyedStateStore(store_root, 0).load(10) is None


# -------------------------------------------------------- incremental snapshots


def test_snapshot_size_follows_the_changed_keys(tmp_path: Path) -> None:
    """Given 100,000 keys snapshotted once, when 1 % of them change before the next checkpoint, the
    next snapshot's new piece holds those keys only, about 1 % of the full size, and its manifest
    rebuilds the whole state."""
    settings = settings_for(tmp_path, 1)
    store = KeyedStateStore(settings.state_root, 0)
    state: KeyedState = {}
    for i in range(100_000):
        key = f"key-{i}"
        state.setdefault(key_group(key), {})[key] = json.dumps(i).encode()
    store.seed(state)
    location = (tmp_path / "chk").as_uri()
    groups = key_group_range(0, 1)
    _, _, full = write_snapshot(
        store, state, groups, 128, "keyed-0", settings, barrier(f"{location}/chk-1", 1), 0, STEP
    )
    assert full is not None and full.kind == "full" and full.keys == 100_000

    changes: dict[int, dict[str, bytes | None]] = {}
    for i in random.Random(2).sample(range(100_000), 1_000):
        key = f"key-{i}"
        changes.setdefault(key_group(key), {})[key] = b"-1"
    apply_changes(state, changes)
    store.save(1, state, changes)
    uri, data, delta = write_snapshot(
        store, state, groups, 128, "keyed-0", settings, barrier(f"{location}/chk-2", 2), 1, STEP
    )
    assert delta is not None and delta.kind == "delta" and delta.keys == 1_000
    assert 0.005 < delta.size / full.size < 0.02, (delta.size, full.size)
    manifest = Manifest.from_bytes(data, uri)
    assert [p.kind for p in manifest.pieces] == ["full", "delta"]
    rebuilt, pieces = read_keyed_state({"keyed-0": handle_of(uri, data)}, range(128), 128)
    assert rebuilt == state and pieces == 2


def test_chains_are_bounded_and_savepoints_stand_alone(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, 1)
    store = KeyedStateStore(settings.state_root, 0)
    state: KeyedState = {key_group("a"): {"a": b"0"}}
    store.seed(state)
    location = (tmp_path / "chk").as_uri()
    kinds = []
    for batch in range(1, MAX_CHAIN + 3):
        changes: dict[int, dict[str, bytes | None]] = {key_group("a"): {"a": str(batch).encode()}}
        apply_changes(state, changes)
        store.save(batch, state, changes)
        uri, data, piece = write_snapshot(
            store,
            state,
            range(128),
            128,
            "keyed-0",
            settings,
            barrier(f"{location}/chk-{batch}", batch),
            batch,
            STEP,
        )
        assert piece is not None
        kinds.append(piece.kind)
        assert len(Manifest.from_bytes(data, uri).pieces) <= MAX_CHAIN
    assert kinds[0] == "full" and "delta" in kinds and kinds.count("full") >= 2
    savepoint = (tmp_path / "sp").as_uri()
    uri, data, piece = write_snapshot(
        store, state, range(128), 128, "keyed-0", settings, barrier(savepoint, 99, "SAVEPOINT"), 50, STEP
    )
    assert piece is not None and piece.kind == "full"
    assert [p.uri.startswith(savepoint) for p in Manifest.from_bytes(data, uri).pieces] == [True]


def test_a_rerun_of_the_barrier_batch_acks_the_same_snapshot_again(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, 1)
    store = KeyedStateStore(settings.state_root, 0)
    store.seed({1: {"a": b"1"}})
    location = f"{(tmp_path / 'chk').as_uri()}/chk-1"
    first = write_snapshot(
        store, {1: {"a": b"1"}}, range(128), 128, "keyed-0", settings, barrier(location, 1), 3, STEP
    )
    again = write_snapshot(
        store, {1: {"a": b"1"}}, range(128), 128, "keyed-0", settings, barrier(location, 1), 3, STEP
    )
    assert again[:2] == first[:2] and again[2] is None


# ------------------------------------------------------------------- rescaling


@settings(max_examples=10, deadline=None)
@given(st.sampled_from([1, 3, 8]), st.sampled_from([1, 3, 16, 128]))
def test_snapshots_of_p_partitions_restore_into_any_other_number(old: int, new: int) -> None:
    """Given keyed snapshots of ``old`` partitions, each of ``new`` partitions reads exactly its own
    key groups, and together they hold every key with its state."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        everything = {f"w{i}": str(i).encode() for i in range(500)}
        handles = {}
        for index, part in enumerate(partitioned(everything, old)):
            settings = settings_for(root, old)
            store = KeyedStateStore(settings.state_root, index)
            store.seed(part)
            uri, data, _ = write_snapshot(
                store, part, key_group_range(index, old), 128, keyed_task_id(index), settings,
                barrier(f"{(root / 'chk').as_uri()}/chk-4", 4), 9, STEP,
            )  # fmt: skip
            handles[keyed_task_id(index)] = handle_of(uri, data)
        merged: dict[str, bytes] = {}
        for index in range(new):
            owned = key_group_range(index, new)
            state, _ = read_keyed_state(handles, owned, 128)
            assert set(state) <= set(owned)
            for keys in state.values():
                merged.update(keys)
        assert merged == everything


def test_a_snapshot_of_another_max_parallelism_is_refused(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, 1)
    store = KeyedStateStore(settings.state_root, 0)
    uri, data, _ = write_snapshot(
        store, {}, range(256), 256, "keyed-0", settings, barrier(f"{(tmp_path / 'c').as_uri()}/chk-1", 1), 0,
        STEP,
    )  # fmt: skip
    with pytest.raises(SnapshotCorrupted, match="max parallelism 256"):
        read_keyed_state({"keyed-0": handle_of(uri, data)}, range(128), 128)


def _manifest_naming(tmp_path: Path, piece_uri: str, piece: bytes) -> StateHandle:
    """A manifest of task keyed-0 in ``<tmp>/job/chk-1`` whose one piece is ``piece_uri``."""
    manifest = {
        "format": "cutline.keyed/1", "task": "keyed-0", "max_parallelism": 128, "key_groups": [0, 128],
        "batch": 0,
        "pieces": [{"uri": piece_uri, "size": len(piece), "sha256": hashlib.sha256(piece).hexdigest(),
                    "kind": "full", "keys": 1}],
    }  # fmt: skip
    data = json.dumps(manifest).encode()
    target = tmp_path / "job" / "chk-1" / "keyed-0"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return handle_of(target.as_uri(), data)


def test_a_manifest_cannot_name_pieces_outside_the_checkpoint_location(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.full"
    piece = encode_piece({1: {"a": b"1"}})
    outside.write_bytes(piece)
    handle = _manifest_naming(tmp_path, outside.as_uri(), piece)
    with pytest.raises(SnapshotCorrupted, match="outside"):
        read_keyed_state({"keyed-0": handle}, range(128), 128)


def test_a_percent_encoded_way_out_of_the_location_is_no_way_out(tmp_path: Path) -> None:
    """Given a manifest whose piece is ``<location>/chk-1/%2e%2e/%2e%2e/elsewhere.full`` (a string that
    starts with the location, and a file outside it once decoded), the piece is refused unread."""
    outside = tmp_path / "elsewhere.full"
    piece = encode_piece({1: {"a": b"1"}})
    outside.write_bytes(piece)
    sneaky = f"{(tmp_path / 'job' / 'chk-1').as_uri()}/%2e%2e/%2e%2e/elsewhere.full"
    handle = _manifest_naming(tmp_path, sneaky, piece)
    with pytest.raises(SnapshotCorrupted, match="outside"):
        read_keyed_state({"keyed-0": handle}, range(128), 128)


def test_a_symbolic_link_out_of_the_location_is_no_way_out(tmp_path: Path) -> None:
    """Given a piece inside the checkpoint directory that is a symbolic link to a file outside the
    job's location (with the right size and hash), the restore refuses it unread (issue 53)."""
    outside = tmp_path / "elsewhere.full"
    piece = encode_piece({1: {"a": b"1"}})
    outside.write_bytes(piece)
    link = tmp_path / "job" / "chk-1" / "keyed-0-0.full"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside)
    handle = _manifest_naming(tmp_path, link.as_uri(), piece)
    with pytest.raises(SnapshotCorrupted, match="symbolic link"):
        read_keyed_state({"keyed-0": handle}, range(128), 128)


def test_a_piece_that_matches_its_hash_but_is_not_arrow_is_corrupt(tmp_path: Path) -> None:
    """Given a piece whose bytes match the manifest's size and sha256 but are no Arrow stream, reading
    it raises SnapshotCorrupted (a restore then tries an older checkpoint), not ArrowInvalid."""
    junk = b"this is not an Arrow stream"
    inside = tmp_path / "job" / "chk-1" / "keyed-0.full"
    inside.parent.mkdir(parents=True)
    inside.write_bytes(junk)
    handle = _manifest_naming(tmp_path, inside.as_uri(), junk)
    with pytest.raises(SnapshotCorrupted, match="not an Arrow stream"):
        read_keyed_state({"keyed-0": handle}, range(128), 128)


def test_a_manifest_records_its_step_and_an_old_one_has_none(tmp_path: Path) -> None:
    """A snapshot's manifest records the step's uid and key function; a manifest written before they
    were recorded parses with no step (it restores into any step)."""
    settings = settings_for(tmp_path, 1)
    store = KeyedStateStore(settings.state_root, 0)
    location = f"{(tmp_path / 'job').as_uri()}/chk-1"
    uri, data, _ = write_snapshot(
        store, {}, range(128), 128, "keyed-0", settings, barrier(location, 1), 0, STEP
    )
    assert STEP == Manifest.from_bytes(data, uri).step
    old = json.loads(data)
    del old["step"]
    assert Manifest.from_bytes(json.dumps(old).encode(), uri).step is None


def test_a_corrupt_piece_is_found_by_its_hash(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, 1)
    store = KeyedStateStore(settings.state_root, 0)
    location = f"{(tmp_path / 'job').as_uri()}/chk-1"
    uri, data, piece = write_snapshot(
        store, {1: {"a": b"1"}}, range(128), 128, "keyed-0", settings, barrier(location, 1), 0, STEP
    )
    assert piece is not None
    Path(piece.uri.removeprefix("file://")).write_bytes(encode_piece({1: {"a": b"2"}}))
    with pytest.raises(SnapshotCorrupted, match="corrupt"):
        read_keyed_state({"keyed-0": handle_of(uri, data)}, range(128), 128)

"""One view of the coordinator group (coordinator/service/group_view.py): this worker's jobs and its peers'
answers merged into every job of the group with its owner, and the peers that could not be asked."""

from __future__ import annotations

from typing import Any

from coordinator.service.group_view import (
    GroupView,
    OwnedJob,
    PeerAnswered,
    PeerFailed,
    group_view,
    owner_of,
    peers_to_ask,
)

SELF = "http://127.0.0.1:6066"
PEER = "http://127.0.0.1:6067"
OTHER = "http://127.0.0.1:6068"


def job(job_id: str, **fields: Any) -> dict[str, Any]:
    return {"id": job_id, "status": "RUNNING", **fields}


def nobody(job_id: str) -> str | None:
    return None


class TestGroupView:
    def test_every_job_of_every_worker_is_listed_once_with_its_owner_by_id(self) -> None:
        """Given this worker's jobs and two peers' answers, the view lists every job, sorted by id,
        each with the worker that reported it."""
        answers = [
            PeerAnswered(PEER, {"jobs": [job("b"), job("d")]}),
            PeerAnswered(OTHER, {"jobs": [job("a")]}),
        ]

        view = group_view(SELF, [job("c")], answers, nobody)

        assert (
            GroupView(
                (
                    OwnedJob(OTHER, job("a")),
                    OwnedJob(PEER, job("b")),
                    OwnedJob(SELF, job("c")),
                    OwnedJob(PEER, job("d")),
                ),
                (),
            )
            == view
        )

    def test_a_failed_peer_is_unreachable_and_the_others_are_still_shown(self) -> None:
        """A peer that timed out is listed as unreachable with its reason; the jobs of this worker
        and of the peers that answered are all there."""
        answers = [PeerFailed(OTHER, "no answer within 1 s"), PeerAnswered(PEER, {"jobs": [job("b")]})]

        view = group_view(SELF, [job("a")], answers, nobody)

        assert ["a", "b"] == [j.job_id for j in view.jobs]
        assert (PeerFailed(OTHER, "no answer within 1 s"),) == view.unreachable

    def test_an_answer_that_is_not_a_list_of_jobs_makes_its_peer_unreachable(self) -> None:
        """A peer answering a JSON list, a string or jobs that are not a list is unreachable; its
        answer adds no job."""
        answers = [
            PeerAnswered(PEER, ["a"]),
            PeerAnswered(OTHER, {"jobs": "a"}),
            PeerAnswered("http://x", "?"),
        ]

        view = group_view(SELF, [], answers, nobody)

        assert () == view.jobs
        assert [PEER, OTHER, "http://x"] == [u.url for u in view.unreachable]
        assert {"its answer is not a list of jobs"} == {u.reason for u in view.unreachable}

    def test_entries_without_a_string_id_are_left_out(self) -> None:
        """A peer's entry that is not an object, or has no string id, is dropped; its good entries stay."""
        answers = [PeerAnswered(PEER, {"jobs": [job("b"), {"id": 7}, "c", {"status": "RUNNING"}, None]})]

        view = group_view(SELF, [], answers, nobody)

        assert (OwnedJob(PEER, job("b")),) == view.jobs
        assert () == view.unreachable

    def test_a_job_two_workers_report_is_shown_as_its_assigned_owner_reports_it(self) -> None:
        """During a handover two workers may both hold a job: the view shows the report of the
        member the group's assignment names."""
        answers = [PeerAnswered(PEER, {"jobs": [job("a", attempt=2)]})]

        view = group_view(SELF, [job("a", attempt=1)], answers, lambda job_id: PEER)

        assert (OwnedJob(PEER, job("a", attempt=2)),) == view.jobs

    def test_without_an_assigned_owner_among_them_this_worker_s_report_wins(self) -> None:
        """When the assignment names neither, this worker's own report is shown."""
        answers = [PeerAnswered(PEER, {"jobs": [job("a", attempt=2)]})]

        view = group_view(SELF, [job("a", attempt=1)], answers, lambda job_id: OTHER)

        assert (OwnedJob(SELF, job("a", attempt=1)),) == view.jobs

    def test_between_two_peers_the_lowest_address_wins(self) -> None:
        """Neither the assignment nor this worker: the peer with the lowest address, whatever the
        order of the answers."""
        answers = [
            PeerAnswered(OTHER, {"jobs": [job("a", attempt=3)]}),
            PeerAnswered(PEER, {"jobs": [job("a")]}),
        ]

        view = group_view(SELF, [], answers, nobody)

        assert (OwnedJob(PEER, job("a")),) == view.jobs

    def test_no_peer_gives_this_worker_s_jobs(self) -> None:
        """A worker alone in its group shows its own jobs."""
        assert GroupView((OwnedJob(SELF, job("a")),), ()) == group_view(SELF, [job("a")], [], nobody)


class TestPeersToAsk:
    def test_every_other_member_with_an_http_address_is_asked(self) -> None:
        """This worker is not asked; the others are, in address order, each once."""
        asked, refused = peers_to_ask(SELF, [OTHER, SELF, PEER, OTHER])

        assert ([PEER, OTHER], []) == (asked, refused)

    def test_a_member_advertising_a_non_http_address_is_not_asked(self) -> None:
        """A ``javascript:`` or ``file:`` address is never fetched: it is unreachable, with why."""
        asked, refused = peers_to_ask(SELF, [PEER, "javascript:alert(1)", "file:///etc/passwd"])

        assert [PEER] == asked
        assert ["file:///etc/passwd", "javascript:alert(1)"] == [r.url for r in refused]
        assert all("not an http(s) URL" in r.reason for r in refused)


class TestOwnerOf:
    def test_the_member_holding_the_partition_owns_it(self) -> None:
        assert PEER == owner_of(3, {SELF: {0, 1}, PEER: {2, 3}})

    def test_nobody_owns_an_unassigned_partition(self) -> None:
        assert owner_of(5, {SELF: {0, 1}, PEER: {2, 3}}) is None

    def test_two_members_naming_one_partition_give_the_lowest_address(self) -> None:
        """Metadata of two generations may overlap for a moment: the answer stays deterministic."""
        assert PEER == owner_of(2, {OTHER: [2], PEER: [2]})

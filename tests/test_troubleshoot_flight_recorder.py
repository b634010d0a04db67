"""unmatched_collective (notebook 07c §4): the analyser's "Not all ranks" block when it prints one, the
same facts derived from the Flight Recorder dumps when it does not (torch 2.11's fr_trace printed none for
07c's dumps), never a parse of free text without that fallback. Real dumps: notebook 07c under nbval."""

import pytest

from mgpu_helpers.troubleshoot import unmatched_collective

FRAME = {"name": "train_uneven", "filename": "/tmp/ipykernel_1/1834675455.py", "line": 6}


def entry(seq, name="gloo:all_reduce", group=("0", "default_pg"), sizes=((1024,),), **kw):
    return {
        "collective_seq_id": seq,
        "profiling_name": name,
        "process_group": group,
        "input_sizes": [list(s) for s in sizes],
        "frames": [FRAME, {"name": "<module>", "filename": "x.py", "line": 1}],
        "state": "scheduled",
        "is_p2p": False,
        **kw,
    }


def dumps_of(last_by_rank, first=1, **kw):
    """Each rank's dump: collectives first … its last sequence number (a ring buffer keeps the end)."""
    return {
        r: {"entries": [entry(s, **kw) for s in range(first, last + 1)]} for r, last in last_by_rank.items()
    }


# What torch 2.13's fr_trace printed for notebook 07c's hang (its "Not all ranks" block and stack).
REPORT_2_13 = """\
Not all ranks joining collective, sequence number: 5
internal record id: 4
group info: 0:default_pg
collective: gloo:all_reduce
missing ranks: {1}
input sizes: [[1024]]
output sizes: [[1024]]
world size: 2
expected ranks: {0, 1}
collective state: scheduled
collective stack trace:
train_uneven at /tmp/ipykernel_1/1834675455.py:6
<module> at x.py:1
"""


def test_the_analysers_block_is_read_when_it_is_there():
    finding = unmatched_collective(dumps_of({0: 5, 1: 4}), REPORT_2_13)
    assert finding["source"] == "fr_trace" and finding["note"] == ""
    assert finding["sequence number"] == 5 and finding["collective"] == "gloo:all_reduce"
    assert finding["missing ranks"] == {1} and finding["input sizes"] == "[[1024]]"
    assert finding["stack"] == ["train_uneven at /tmp/ipykernel_1/1834675455.py:6", "<module> at x.py:1"]
    assert finding["lines"][0].startswith("Not all ranks") and "missing ranks: {1}" in finding["lines"]


@pytest.mark.parametrize(
    "report",
    [
        "",  # nothing printed (or printed elsewhere)
        "INFO: loaded 2 dumps\nno mismatches found\n",  # another release's wording
        REPORT_2_13.replace("missing ranks: {1}", "missing ranks: rank one"),  # a block that does not parse
        None,  # no analyser run at all
    ],
)
def test_without_a_readable_block_the_dumps_answer(report):
    finding = unmatched_collective(dumps_of({0: 5, 1: 4}), report)
    assert finding["source"] == "dumps" and finding["note"]
    assert (finding["sequence number"], finding["collective"], finding["missing ranks"]) == (
        5,
        "gloo:all_reduce",
        {1},
    )
    assert finding["stack"][0] == "train_uneven at /tmp/ipykernel_1/1834675455.py:6"
    assert "last sequence number per rank: {0: 5, 1: 4}" in finding["lines"]


def test_the_dumps_answer_with_wrapped_ring_buffers_subgroups_and_p2p():
    # 3 ranks, 4-entry ring buffers (every dump holds 4 entries), rank 2 skipped #9, a broadcast
    dumps = dumps_of({0: 9, 1: 9, 2: 8}, name="gloo:broadcast")
    for r, dump in dumps.items():
        dump["entries"] = dump["entries"][-4:]
        if r < 2:  # a subgroup of ranks 0 and 1, in step: rank 2 is no member, not a missing one
            dump["entries"].append(entry(3, group=("1", "sub"), name="gloo:all_gather"))
        dump["entries"].append(entry(0, is_p2p=True, p2p_seq_id=r + 1, name="gloo:send"))  # numbered apart
    finding = unmatched_collective(dumps)
    assert (finding["sequence number"], finding["collective"], finding["missing ranks"]) == (
        9,
        "gloo:broadcast",
        {2},
    )
    relabelled = {(r + 1) % 3: d for r, d in dumps.items()}
    assert unmatched_collective(relabelled)["missing ranks"] == {0}


def test_ranks_in_step_have_no_unmatched_collective():
    assert unmatched_collective(dumps_of({0: 4, 1: 4}), "no block here") is None


@pytest.mark.parametrize("dumps", [None, [1, 2], {0: "not a dump"}])
def test_bad_dumps_are_refused(dumps):
    with pytest.raises(TypeError, match="unpickled Flight Recorder dump"):
        unmatched_collective(dumps)


def test_exercise_07c1_does_not_accept_the_helper_as_its_answer(capsys):
    from mgpu_helpers.exercises import grade

    def who_is_behind(dumps):
        finding = unmatched_collective(dumps)
        return min(finding["missing ranks"]), finding["collective"]

    assert not grade("07c.1", who_is_behind)
    assert "unmatched_collective, a ready-made answer" in capsys.readouterr().out

"""The short fault campaign (``tests/faults/fault_campaign.py`` with a few trials per fault): real runs on
micro pipelines, killed at random moments and at the store's commit points, stopped with SIGTERM, failed by a
full disk, given a corrupted shard, and (RL) run as two ranks of which one is killed. After each, what a
reader sees in the store must verify, and the rerun must resume from the newest committed resume point (or
reuse the committed outcome) and end bit for bit where an uninterrupted run ends."""

from __future__ import annotations

import random

import fault_campaign as faults
import pytest

pytestmark = [pytest.mark.slow]


def assert_survived(t: faults.Trial) -> None:
    where = f"{t.kind} {t.fault}: {t}"
    assert t.torn == 0, f"a reader saw a torn checkpoint or outcome: {where}"
    assert t.resumed, f"the rerun failed: {where}"
    assert t.lost == 0, f"the rerun did not resume from the newest committed step: {where}"
    assert t.equal, f"the resumed run did not end where an uninterrupted run ends: {where}"


def assert_killed(ref: faults.Reference, t: faults.Trial, fault: str | None) -> None:
    """The kill happened: a named write point the reference run passed at least that often ends the run
    by SIGKILL (an unreached point would let the trial exit 0 and prove nothing); a kill at a random
    moment may lose the race to a short run, and then says so."""
    if fault is None:
        assert t.exit_code == -9 or "finished before the kill" in t.note, t
        return
    point, n = fault.split(":")
    passed = ref.counts.get({"outcome-after": "outcome"}.get(point, point), 0)
    assert passed >= int(n), (
        f"{ref.kind}: the reference passed {point} {passed} times, so {fault} never fires"
    )
    assert t.exit_code == -9, f"{ref.kind} {fault}: the run was not killed at its write point: {t}"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def references(work):
    """One uninterrupted reference run per (stage kind, dp), shared by every trial of this module that
    runs on the same worker (the xdist groups keep a kind's trials together)."""
    made = {}

    def get(kind: str, dp: int = 1) -> faults.Reference:
        if (kind, dp) not in made:
            made[kind, dp] = faults.reference(kind, work, dp=dp)
        return made[kind, dp]

    return get


@pytest.mark.xdist_group("faults-pretrain")
def test_pretrain_survives_kills_sigterm_a_full_disk_and_refuses_a_corrupt_shard(work, references):
    rng = random.Random(1)
    ref = references("pretrain")
    assert ref.counts["shard"] >= 2 and ref.counts["commit"] >= 2  # the points below were passed
    for i, fault in enumerate([None, "shard:2", "commit:2", "outcome:1"]):
        t = faults.kill_trial(ref, work, i, rng, fault)
        assert_killed(ref, t, fault)
        assert_survived(t)
    term = faults.sigterm_trial(ref, work, 0, rng, delay_s=0.0)
    assert term.exit_code == 143 and term.extra["saved_on_signal"] and term.extra["within_grace"], term
    assert term.newest_step > 0
    assert_survived(term)
    full = faults.disk_full_trial(ref, work, 0, rng)
    assert full.extra["clean_error"], full
    assert_survived(full)
    bad = faults.corrupt_trial(ref, work, 0, rng)
    assert bad.extra == {"verify_exit": 2, "verify_names_file": True, "rerun_refused": True}, bad


@pytest.mark.xdist_group("faults-rl")
def test_rl_survives_kills_sigterm_and_a_killed_rank(work, references):
    rng = random.Random(2)
    ref = references("rl")
    for i, fault in enumerate([None, "commit:3", "manifest:2"]):
        t = faults.kill_trial(ref, work, i, rng, fault)
        assert_killed(ref, t, fault)
        assert_survived(t)
    term = faults.sigterm_trial(ref, work, 0, rng, delay_s=0.0)
    assert term.exit_code == 143 and term.extra["saved_on_signal"] and term.extra["within_grace"], term
    assert_survived(term)
    two = references("rl", dp=2)
    rank = faults.rank_kill_trial(two, work, 0, rng)
    assert rank.exit_code not in (None, 0) and rank.extra["job_end_s"] < 60, rank
    assert_survived(rank)


@pytest.mark.xdist_group("faults-distill-eval")  # its own references: free to run beside the RL trials
def test_distill_and_eval_survive_kills(work, references):
    rng = random.Random(3)
    for kind, trials in (("distill", [None, "shard:2", "outcome-after:1"]), ("eval", [None, "outcome:1"])):
        ref = references(kind)
        for i, fault in enumerate(trials):
            t = faults.kill_trial(ref, work, i, rng, fault)
            assert_killed(ref, t, fault)
            assert_survived(t)


@pytest.mark.xdist_group("faults-pretrain")
def test_pretrain_rides_out_a_short_s3_outage_and_fails_cleanly_in_a_long_one(work, references):
    """The S3 server stopped mid-stage and started again with its data: an outage within the store's retry
    budget is ridden out (the run finishes), a longer one is not (a clear error, nothing half-written
    visible); the rerun of either ends where an uninterrupted run ends. The trials shrink the budget
    (waits of 0.1-0.2 s doubling, five retries: 3.1-6.2 s in all, against 7.75-15.5 s by default) so that
    an outage of 0.5 s proves what 3 s proves at the default budget (tests/faults/fault_campaign.py runs 3 s
    and 60 s); the long outage lasts until the run gives up, so a run that computes through part of it cannot
    outlast it (a fixed 10 s outage was once ridden out that way on loaded cores)."""
    rng = random.Random(4)
    s3 = faults.MotoS3()
    ref = references("pretrain")
    backoff = {"max_retries": 5, "backoff_base_s": 0.2, "backoff_max_s": 4.0}
    short = faults.s3_restart_trial(ref, work, 0, rng, s3, 0.5, backoff)
    assert short.extra == {"finished": True, "clean_error": True}, short
    assert_survived(short)
    long = faults.s3_restart_trial(ref, work, 1, rng, s3, None, backoff)
    assert long.extra == {"finished": False, "clean_error": True} and "still failing after" in long.note, long
    assert_survived(long)


def test_the_score_catches_a_rerun_that_starts_over():
    """Negative control: a rerun that trained from 0 although step 4 was committed counts as lost."""
    t = faults.Trial("pretrain", "random-time", resumed=True, resumed_from=0, lost=4, equal=True)
    with pytest.raises(AssertionError, match="did not resume"):
        assert_survived(t)

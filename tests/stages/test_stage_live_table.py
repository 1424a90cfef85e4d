"""The live console table shows the engine gap apart from the staleness-inclusive tail, and corrections."""

from ringzero.stages.live_table import LiveTable


def test_the_table_shows_gap_tail_masking_and_rollbacks(capsys):
    table = LiveTable("stage1", every=2)
    table.add(0, {"reward/mean": 0.25, "gap/ratio/p99": 3.1e-2, "ratio/p99": 7.7e-2})
    assert capsys.readouterr().err == ""  # shown every 2 steps only
    table.add(
        1,
        {
            "reward/mean": 0.5,
            "gap/ratio/p99": 1.5e-3,
            "ratio/p99": 4.4e-2,
            "correction/token_masked_frac": 0.0125,
            "rollback/count": 1.0,
            "loss/total": float("nan"),
        },
    )
    err = capsys.readouterr().err
    for text in ("gap p99", "|r-1| p99", "masked", "rollbacks", "3.10e-02", "1.50e-03", "4.40e-02", "0.013"):
        assert text in err, text
    first = next(line for line in err.splitlines() if "3.10e-02" in line)
    assert "7.70e-02" in first and "0.013" not in first  # each row its own step's numbers, "-" where absent

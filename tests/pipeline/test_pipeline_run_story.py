"""``ringzero.pipeline.story`` (``bench/run_story.py``) reads a finished run's manifest into the README's
tables: the eval stage's input checkpoint and its compare rows, the gap per policy and third, and the targets
as the run reported them."""

import json

from ringzero.pipeline import story as run_story


def manifest() -> dict:
    summary = {
        "eval/accuracy": 0.9,
        "eval/len_mean": 40.0,
        "eval/fast/within_budget": 0.95,
        "eval/fast/hard/accuracy": 0.6,
        "eval/fast/hard/len_mean": 30.0,
        "eval/gap/bf16/ratio/p99": 0.02,
        "eval/gap/bf16/long/seq_abs_log_ratio": 0.03,
        "compare/stage1/accuracy": 0.8,
        "compare/stage1/len_mean": 60.0,
        "compare/stage1/gap/bf16/ratio/p99": 0.01,
        "compare/tier/accuracy": 0.9,
    }
    return {
        "stages": [
            {
                "name": "stage1",
                "kind": "rl",
                "stop_reason": "steps",
                "steps": 40,
                "wall_s": 120.0,
                "summary": {"ratio/p99": 0.02, "ratio/p99_median": 0.03, "ratio/max": 0.8},
            },
            {
                "name": "eval",
                "kind": "eval",
                "stop_reason": "done",
                "steps": 2,
                "wall_s": 30.0,
                "summary": summary,
                "inputs": {"init_uri": "u/tier", "compare": {"stage1": "u/stage1", "tier": "u/tier"}},
            },
        ],
        "targets": [
            {
                "name": "stage 1 pass@1",
                "expr": "eval.compare/stage1/accuracy >= 0.90",
                "left": 0.8,
                "right": 0.9,
                "status": "missed",
            }
        ],
    }


def test_the_input_checkpoint_takes_the_eval_keys_and_the_others_their_compare_rows():
    rows = run_story.eval_rows(manifest())
    assert (
        rows["tier"]["accuracy"] == 0.9 and rows["tier"]["gap/bf16/ratio/p99"] == 0.02
    )  # eval/, not compare/
    assert rows["stage1"] == {"accuracy": 0.8, "len_mean": 60.0, "gap/bf16/ratio/p99": 0.01}


def test_tables_carry_the_values_and_the_target_status():
    m = manifest()
    rows = run_story.eval_rows(m)
    stages = run_story.stages_table(m)
    assert "| stage1 | rl | steps | 40 | 2 | 0.02 | 0.03 | 0.8 |" in stages
    gap = run_story.gap_table(rows)
    assert "| tier | bf16 | 0.02 | - | - | - | - | 0.03 |" in gap and "| stage1 | bf16 | 0.01 |" in gap
    assert "| tier | fast | - / - | - / - | 0.6 / 30 | - |" in run_story.buckets_table(rows)
    assert (
        "| stage 1 pass@1 | `eval.compare/stage1/accuracy >= 0.90` | 0.8 | 0.9 | missed |"
        in run_story.targets_table(m)
    )


def test_the_cli_prints_the_chosen_tables(tmp_path, capsys):
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest()))
    import sys

    argv, sys.argv = sys.argv, ["run_story.py", str(path), "--tables", "stages,targets"]
    try:
        assert run_story.main() == 0
    finally:
        sys.argv = argv
    out = capsys.readouterr().out
    assert "### stages" in out and "### targets" in out and "### gap" not in out

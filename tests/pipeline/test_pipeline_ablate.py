"""``ringzero ablate``: arms cut from the run file, a stage's own seed and precision, the verdict rule, and
one real ablation end to end on the micro config (the base pretrained once and shared by every arm)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ringzero.config.loader import parse_config
from ringzero.config.run import stage_view
from ringzero.errors import RingzeroError
from ringzero.pipeline.ablate import ArmRun, study_data, verdict_over_seeds
from ringzero.pipeline.identity import stage_hash
from ringzero.pipeline.studies import DEPTH, DISTILL, ISLANDS, LOSS, STUDIES
from ringzero.stages.base import StageInputs

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny-cpu.yaml"
MICRO = ROOT / "tests" / "jobs" / "micro-run.yaml"


def tiny() -> dict:
    return yaml.safe_load(TINY.read_text())


def test_an_arm_is_the_run_cut_at_its_last_stage_with_gates_off_and_later_stages_seeded():
    data = study_data(tiny(), "distill", ["stage1", "distill"], seed=3)
    stages = data["stages"]
    assert [s["name"] for s in stages] == ["base", "stage1", "distill", "eval"]
    assert all(s["gate"] == [] for s in stages)
    assert "seed" not in stages[0]  # the pretrained base is shared by every seed
    assert [s["seed"] for s in stages[1:]] == [3, 3, 3]
    ev = stages[-1]
    assert ev["init"] == "distill" and ev["compare"] == ["stage1", "distill"]
    assert ev["sampling"] == {"max_new_tokens": 160}  # the config's own eval settings
    assert data["targets"] == []
    parse_config(data)  # a valid run


@pytest.mark.parametrize(
    ("through", "measure", "needle"),
    [("stage9", ["stage1"], "no stage 'stage9'"), ("stage1", ["distill"], "not at or before 'stage1'")],
)
def test_an_arm_that_names_a_missing_or_later_stage_is_refused(through, measure, needle):
    with pytest.raises(RingzeroError, match=needle):
        study_data(tiny(), through, measure, seed=0)


def hashes(data: dict) -> dict[str, str]:
    cfg, prev, out = parse_config(data), None, {}
    for st in cfg.stages:
        inputs = StageInputs(init_uri=prev, reference_uri=prev if st.kind == "rl" else None)
        out[st.name] = stage_hash(cfg, st, inputs)
        prev = f"file://s/{out[st.name][:16]}"
    return out


def test_a_stage_seed_equal_to_the_runs_is_the_same_stage_and_another_seed_leaves_the_base_alone():
    plain = hashes(tiny())
    same = tiny()
    same["stages"][1]["seed"] = 0  # run.seed is 0
    assert hashes(same) == plain
    other = tiny()
    other["stages"][1]["seed"] = 1
    changed = hashes(other)
    assert changed["base"] == plain["base"]
    assert changed["stage1"] != plain["stage1"]
    assert changed["distill"] != plain["distill"]  # downstream of a different checkpoint


def test_a_stage_precision_counts_as_what_the_stage_runs_under():
    own = tiny()
    own["stages"][1]["precision"] = {"train": "fp32-islands", "rollout": "bf16"}
    run_wide = tiny()
    run_wide["precision"] = {"train": "fp32-islands", "rollout": "bf16"}
    cfg = parse_config(own)
    view = stage_view(cfg, cfg.stage("stage1"))
    assert (view.precision.train.name(), view.precision.rollout.name()) == ("fp32-islands", "bf16")
    assert stage_view(cfg, cfg.stage("base")) is cfg
    inputs = StageInputs(init_uri="file://s/base", reference_uri="file://s/base")
    other = parse_config(run_wide)
    assert stage_hash(cfg, cfg.stage("stage1"), inputs) == stage_hash(other, other.stage("stage1"), inputs)
    assert hashes(own)["base"] == hashes(tiny())["base"]


def test_the_verdict_holds_on_every_seed_fails_on_none_and_is_otherwise_inconclusive():
    assert verdict_over_seeds([True, True]) == "held"
    assert verdict_over_seeds([False, False]) == "did not hold"
    assert verdict_over_seeds([True, False]) == "inconclusive"
    assert verdict_over_seeds([]) == "did not hold"


def loss_row(growth: float, drift: float) -> dict:
    return {"len_growth": growth, "stage1/bf16_drift": drift}


def test_the_loss_claim_needs_more_growth_and_more_drift_on_each_seed():
    readouts = {
        ("token_sum", 0): loss_row(1.6, 0.02),
        ("token_sum", 1): loss_row(1.5, 0.02),
        ("sample_mean", 0): loss_row(1.0, 0.01),
        ("sample_mean", 1): loss_row(1.48, 0.01),  # within the growth margin on seed 1
        ("token_mean", 0): loss_row(2.0, 0.03),
        ("token_mean", 1): loss_row(2.0, 0.03),
    }
    verdicts = {v["claim"].split()[-6]: v["verdict"] for v in LOSS.verdicts(readouts, [0, 1])}
    assert verdicts == {"sample_mean": "inconclusive", "token_mean": "did not hold"}


def depth_row(fast: dict, gap_hard: float, gap_easy: float, ok_tier: float, ok_stage2: float) -> dict:
    row = {f"tier/fast/{b}/accuracy": a for b, a in fast.items()}
    row.update({f"baseline/{b}": 0.5 for b in fast})  # the cue answered without a trace
    row.update(
        {
            "tier/gap/hard": gap_hard,
            "tier/gap/easy": gap_easy,
            "stage2/gap/hard": 0.0,
            "tier/fast/hard/correct_within_budget": ok_tier,
            "stage2/fast/hard/correct_within_budget": ok_stage2,
        }
    )
    return row


def test_a_fast_tier_no_better_than_the_no_search_baseline_fails_even_where_depth_pays():
    readouts = {
        ("tiers", 0): depth_row({"easy": 1.0, "medium": 0.9, "hard": 0.5}, 0.5, 0.0, 0.5, 0.375),
        ("tiers", 1): depth_row({"easy": 1.0, "medium": 0.9, "hard": 0.51}, 0.4, 0.0, 0.5, 0.2),
    }
    guesses, pays, beats = (v["verdict"] for v in DEPTH.verdicts(readouts, [0, 1]))
    assert guesses == "inconclusive"  # seed 0's fast tier equals the cue's pass@1 on hard items
    assert pays == "held" and beats == "held"
    readouts[("tiers", 1)]["tier/gap/easy"] = 0.06  # depth that costs on easy items too does not pay
    assert DEPTH.verdicts(readouts, [0, 1])[1]["verdict"] == "inconclusive"
    readouts[("tiers", 0)]["stage2/fast/hard/correct_within_budget"] = 0.4375  # ahead by 0.0625 < 0.10
    assert DEPTH.verdicts(readouts, [0, 1])[2]["verdict"] == "inconclusive"


def test_a_seed_missing_from_one_arm_leaves_its_pair_out_and_names_the_right_seeds():
    readouts = {
        ("token_sum", 0): loss_row(1.6, 0.02),
        ("token_sum", 1): loss_row(1.6, 0.02),
        ("token_sum", 2): loss_row(1.0, 0.02),
        ("sample_mean", 0): loss_row(1.0, 0.01),
        # sample_mean's seed-1 run is missing
        ("sample_mean", 2): loss_row(1.5, 0.01),
    }
    sample = LOSS.verdicts(readouts, [0, 1, 2])[0]
    assert sample["verdict"] == "inconclusive"  # held on seed 0, not on seed 2
    assert (
        sample["detail"].startswith("seed 0: growth 1.60 vs 1.00")
        and "seed 2: growth 1.00 vs 1.50" in sample["detail"]
    )
    assert "seed 1" not in sample["detail"]


def distill_row(ratio_len: float, ratio_drift: float = 0.5, delta: float = 0.0) -> dict:
    return {"ratio/len": ratio_len, "ratio/bf16_drift": ratio_drift, "delta/pass1": delta}


def test_the_selection_claim_needs_shortest_to_beat_the_random_control_by_the_margin():
    readouts = {
        ("shortest", 0): distill_row(0.60),
        ("shortest", 1): distill_row(0.60, delta=-0.05),  # pass@1 lost: this seed's reset fails
        ("random", 0): distill_row(0.75),
        ("random", 1): distill_row(0.69),  # within the margin on seed 1
    }
    shortest, random_, selection = DISTILL.verdicts(readouts, [0, 1])
    assert shortest["verdict"] == "inconclusive" and random_["verdict"] == "held"
    assert selection["verdict"] == "inconclusive"
    readouts[("random", 1)] = distill_row(0.71)
    assert DISTILL.verdicts(readouts, [0, 1])[2]["verdict"] == "held"


def renamed() -> dict:
    """The shipped config with every stage renamed: a study finds its stages by role, not by name."""
    data = tiny()
    names = {s["name"]: f"my-{s['name']}" for s in data["stages"]}
    for s in data["stages"]:
        s["name"] = names[s["name"]]
        for key in ("init", "reference", "compare"):
            if isinstance(s.get(key), str):
                s[key] = names.get(s[key], s[key])
            elif isinstance(s.get(key), list):
                s[key] = [names.get(v, v) for v in s[key]]
    return data


@pytest.mark.parametrize("config", [tiny, renamed], ids=["shipped", "renamed"])
def test_every_study_finds_its_stages_by_role_and_each_arm_loads(config):
    from ringzero.config.loader import apply_overrides
    from ringzero.pipeline.ablate import cast

    data = config()
    for study in STUDIES.values():
        cast_study, role_of = cast(study, data)
        assert set(role_of.values()) == {study.through, *study.measure}
        for arm, sets in cast_study.arms.items():
            cut = study_data(
                apply_overrides(config(), [*cast_study.common, *sets]),
                cast_study.through,
                list(cast_study.measure),
                1,
            )
            cfg = parse_config(cut)
            assert cfg.stages[-1].compare == list(cast_study.measure), (study.name, arm)
            assert all("{" + r + "}" not in o for o in sets for r in role_of.values())
    assert data == config()
    loss, _ = cast(STUDIES["loss"], renamed())
    assert loss.arms["sample_mean"] == ("stages.my-stage1.loss.normalization=sample_mean",)


def test_a_study_whose_roles_the_config_lacks_is_refused_by_role():
    from ringzero.pipeline.ablate import cast

    data = tiny()
    data["stages"] = [s for s in data["stages"] if s["kind"] != "distill"]
    with pytest.raises(RingzeroError, match=r"study 'distill' needs stage role\(s\) \['distill'\]"):
        cast(STUDIES["distill"], data)


def test_an_ablation_runs_its_arms_over_seeds_from_one_shared_base(tmp_path):
    out = tmp_path / "ablate"
    cmd = [
        sys.executable,
        "-m",
        "ringzero.cli.main",
        "ablate",
        str(MICRO),
        "--set",
        f"storage.root=file://{tmp_path}/store",
        "--set",
        f"run.run_dir={tmp_path}/run",
        "--set",
        "stages.base.steps=20",
        "--vary",
        "stages.stage1.loss.normalization=token_sum,token_mean",
        "--through",
        "stage1",
        "--seeds",
        "0,2",
        "--out",
        str(out),
    ]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "token_mean" in done.stdout and "mean ± half-range over seeds" in done.stdout
    study = out / "vary-stages-stage1-loss-normalization"
    result = json.loads((study / "ablation.json").read_text())
    assert sorted((r["arm"], r["seed"]) for r in result["readouts"]) == [
        ("token_mean", 0),
        ("token_mean", 2),
        ("token_sum", 0),
        ("token_sum", 2),
    ]
    identity = {
        (arm, seed, stage): (study / arm / f"seed{seed}" / stage / "identity").read_text()
        for arm in ("token_sum", "token_mean")
        for seed in (0, 2)
        for stage in ("base", "stage1")
        if (study / arm / f"seed{seed}" / stage / "identity").exists()
    }
    bases = {h for (_, _, stage), h in identity.items() if stage == "base"}
    assert len(bases) <= 1  # pretrained by the first arm only, the others found it committed
    stage1 = [h for (_, _, stage), h in identity.items() if stage == "stage1"]
    assert len(stage1) == len(set(stage1)) == 4  # every arm and seed its own stage 1
    assert all("stage1/pass1" in r for r in result["readouts"])
    page = (study / "report.html").read_text()
    assert "<table" in page and "token_mean" in page


def test_the_islands_readout_takes_a_stage_summary_s_median_of_the_gap_and_its_own_ratios():
    """Readouts from a hand-built run: an even count of steps gives the mean of the middle two p99s (the
    stage summary's ``ratio/p99_median``), the max over steps, and islands / bf16 per checkpoint."""
    steps = [
        {"step": k + 1, "gap/ratio/p99": p, "gap/ratio/max": m}
        for k, (p, m) in enumerate([(0.4, 1.0), (0.1, 3.0), (0.3, 2.0), (float("nan"), 9.0), (0.2, 0.5)])
    ]
    row = {"eval/accuracy": 0.5, "eval/gap/bf16/ratio/p99": 0.03, "eval/gap/fp32-islands/ratio/p99": 0.01}
    run = ArmRun("fp32", 0, {"stage1": steps}, {}, {"stage1": 50.0}, {"base": row, "stage1": dict(row)})
    out = ISLANDS.readout(run)
    assert out["train/gap_p99_median"] == pytest.approx(0.25)  # finite p99s 0.1 0.2 0.3 0.4
    assert out["train/gap_max"] == 9.0
    assert out["stage1_s_per_step"] == 10.0
    assert out["base/islands_over_bf16"] == pytest.approx(1 / 3)

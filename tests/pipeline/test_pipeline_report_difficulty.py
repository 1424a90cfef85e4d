"""The report's length- and accuracy-against-difficulty plots: one line per checkpoint and tier, a point
per bucket measured, nothing when the eval measured no buckets."""

from html_kit import parse

from ringzero.pipeline.report import _difficulty_plots


def comparison(with_buckets: bool = True) -> dict:
    rows = []
    for name, fast_len in (("stage2", 40.0), ("tier", 30.0)):
        values = {
            "eval/easy/len_mean": 20.0,
            "eval/hard/len_mean": 60.0,  # no medium: a missing point
            "eval/fast/easy/len_mean": fast_len,
            "eval/fast/medium/len_mean": fast_len,
            "eval/fast/hard/len_mean": fast_len,
            "eval/deep/hard/len_mean": 90.0,
            "eval/fast/hard/accuracy": 0.4,
            "eval/deep/hard/accuracy": 0.9,
        }
        rows.append({"checkpoint": name, "values": values})
    spec = {"buckets": ["easy", "medium", "hard"] if with_buckets else [], "tiers": ["fast", "deep"]}
    return {"columns": [], "rows": rows, "difficulty": spec}


def lines_of(doc, metric: str) -> dict[str, tuple[int, bool]]:
    (start,) = [
        i for i, (t, a) in enumerate(doc.elements) if t == "figure" and a.get("data-metric") == metric
    ]
    out, label = {}, None
    for tag, attrs in doc.elements[start + 1 :]:
        if tag == "figure":
            break
        if tag == "g" and "data-line" in attrs:
            label = attrs["data-line"]
        if tag == "polyline":
            out[label] = (len(attrs["points"].split()), "stroke-dasharray" in attrs)
    return out


def test_one_line_per_checkpoint_and_tier_with_a_point_per_measured_bucket():
    doc = parse("".join(_difficulty_plots(comparison())))
    lengths = lines_of(doc, "eval/<tier>/<bucket>/len_mean")
    assert lengths == {
        "stage2": (2, False),
        "stage2 [fast]": (3, True),
        "stage2 [deep]": (1, True),
        "tier": (2, False),
        "tier [fast]": (3, True),
        "tier [deep]": (1, True),
    }
    accuracy = lines_of(doc, "eval/<tier>/<bucket>/accuracy")
    assert set(accuracy) == {"stage2 [fast]", "stage2 [deep]", "tier [fast]", "tier [deep]"}  # untiered: none


def test_no_buckets_no_plots():
    assert _difficulty_plots(comparison(with_buckets=False)) == []
    assert _difficulty_plots({"columns": [], "rows": []}) == []


def test_the_comparison_table_gains_a_row_per_bucket_untiered_and_per_tier():
    from ringzero.config.stages import Tier
    from ringzero.stages.evaluate import comparison_columns
    from ringzero.tasks.base import DIFFICULTY_BUCKETS

    tiers = [Tier(name="fast", tag="[fast]", budget=80)]
    plain = dict(comparison_columns(4, tiers))
    keys = dict(comparison_columns(4, tiers, DIFFICULTY_BUCKETS))
    added = [k for k in keys if k not in plain]
    assert added == [
        f"{head}/{b}/{m}"
        for head in ("eval", "eval/fast")
        for b in DIFFICULTY_BUCKETS
        for m in ("accuracy", "len_mean")
    ]
    assert keys["eval/fast/hard/len_mean"] == "fast hard len"


def test_with_two_tiers_the_table_gains_the_deep_against_fast_contrast():
    from ringzero.config.stages import Tier
    from ringzero.stages.evaluate import comparison_columns
    from ringzero.tasks.base import DIFFICULTY_BUCKETS

    tiers = [Tier(name="deep", tag="[deep]", budget=160), Tier(name="fast", tag="[fast]", budget=50)]
    keys = dict(comparison_columns(4, tiers, DIFFICULTY_BUCKETS))
    assert keys["eval/contrast/hard/accuracy_gap"] == "deep-fast acc (hard)"
    assert keys["eval/contrast/easy/len_ratio"] == "deep/fast len (easy)"
    assert keys["eval/contrast/len_ratio"] == "deep/fast len (all)"
    assert not any("contrast" in k for k in dict(comparison_columns(4, tiers[:1], DIFFICULTY_BUCKETS)))

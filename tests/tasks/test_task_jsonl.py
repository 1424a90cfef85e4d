"""The JSONL task: loading with line-numbered errors, GSM8K answers, prompts and reward."""

import json

import pytest

from ringzero.errors import RingzeroError
from ringzero.tasks import make_task
from ringzero.tasks.config import JsonlTask
from ringzero.tasks.jsonl import MAX_REPORTED_LINES


def write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def gsm(tmp_path):
    write(
        tmp_path / "train.jsonl",
        [
            json.dumps(
                {
                    "question": "Natalia sold 48 clips, then half as many. How many?",
                    "answer": "48/2 = 24\n#### 72",
                }
            ),
            "",
            json.dumps({"question": "What is 1000 + 234?", "answer": "#### 1,234"}),
            json.dumps({"question": "Half of one?", "answer": 0.5}),
        ],
    )
    write(tmp_path / "eval.jsonl", [json.dumps({"q": "Capital of France?", "a": "Paris"})])
    return tmp_path


def test_loads_gsm8k_style_answers(gsm):
    task = make_task(JsonlTask(train_path="train.jsonl"), base_dir=gsm)
    problems = task.prompts("train", 3)
    assert [p.answer for p in problems] == ["72", "1234", "1/2"]
    assert [p.id for p in problems] == ["train:1", "train:3", "train:4"]  # line numbers, blank line skipped
    assert problems[0].prompt == "q: Natalia sold 48 clips, then half as many. How many?\na: "
    assert task.stop == ("\nq:",)


def test_reward_extracts_and_normalizes(gsm):
    task = make_task(JsonlTask(train_path="train.jsonl"), base_dir=gsm)
    natalia, thousand, half = task.prompts("train", 3)
    assert task.reward(natalia, "She sold 24 in May.\n48+24 = 72\n#### 72") == 1.0
    assert task.reward(natalia, "<think> 48+24 </think> \\boxed{72}") == 1.0
    assert task.reward(natalia, "the answer is 72 or maybe 71, I am not sure at all about it") == 0.0
    assert task.reward(thousand, "1,234") == 1.0 and task.reward(thousand, "1234.0") == 1.0
    assert task.reward(half, "A: 1/2") == 1.0 and task.reward(half, "A: 0.50") == 1.0
    assert task.reward(half, "A: 2") == 0.0
    assert task.step_check("#### 72", natalia) == (0, 0)


def test_custom_field_names_and_eval_split(gsm):
    task = make_task(
        JsonlTask(train_path="train.jsonl", eval_path="eval.jsonl", question_field="q", answer_field="a"),
        base_dir=gsm,
    )
    [paris] = task.prompts("eval", 1)
    assert paris.answer == "paris" and task.reward(paris, "Paris.") == 1.0


def test_prompts_shuffle_without_replacement_then_cycle(gsm):
    task = make_task(JsonlTask(train_path="train.jsonl"), base_dir=gsm)
    drawn = task.prompts("train", 6, 1)
    assert sorted(p.id for p in drawn[:3]) == ["train:1", "train:3", "train:4"]
    assert [p.id for p in drawn[3:]] == [p.id for p in drawn[:3]]
    assert [p.id for p in task.prompts("train", 6, 1)] == [p.id for p in drawn]


def test_every_malformed_line_is_reported_with_file_and_line(tmp_path):
    path = write(
        tmp_path / "bad.jsonl",
        [
            json.dumps({"question": "ok?", "answer": "1"}),
            "{not json",
            json.dumps(["a", "list"]),
            json.dumps({"question": "no answer"}),
            json.dumps({"question": "  ", "answer": "1"}),
            json.dumps({"question": "nested", "answer": {"x": 1}}),
            json.dumps({"question": "bool", "answer": True}),
        ],
    )
    task = make_task(JsonlTask(train_path=str(path)))
    with pytest.raises(RingzeroError) as err:
        task.prompts("train", 1, 0)
    msg = str(err.value)
    assert "6 malformed line(s)" in msg
    for lineno, why in [
        (2, "Expecting"),
        (3, "JSON object"),
        (4, "missing field 'answer'"),
        (5, "'question' is empty"),
        (6, "string or a number"),
        (7, "string or a number"),
    ]:
        assert f"{path}:{lineno}: " in msg and why in msg
    assert f"{path}:1:" not in msg


def test_long_lists_of_bad_lines_are_capped(tmp_path):
    path = write(tmp_path / "bad.jsonl", ["nope"] * (MAX_REPORTED_LINES + 5))
    with pytest.raises(RingzeroError, match="and 5 more"):
        make_task(JsonlTask(train_path=str(path))).prompts("train", 1)


def test_missing_files_and_missing_eval_split(tmp_path):
    with pytest.raises(RingzeroError, match="no such file"):
        make_task(JsonlTask(train_path="absent.jsonl"), base_dir=tmp_path).prompts("train", 1)
    write(tmp_path / "t.jsonl", [json.dumps({"question": "a", "answer": "1"})])
    with pytest.raises(RingzeroError, match="eval_path"):
        make_task(JsonlTask(train_path="t.jsonl"), base_dir=tmp_path).prompts("eval", 1)
    write(tmp_path / "empty.jsonl", [""])
    with pytest.raises(RingzeroError, match="no problems"):
        make_task(JsonlTask(train_path="empty.jsonl"), base_dir=tmp_path).prompts("train", 1)

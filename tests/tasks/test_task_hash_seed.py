"""The corpus and the prompt draw do not depend on Python's hash seed: two processes with different
PYTHONHASHSEED values write the same documents and draw the same prompts."""

import os
import subprocess
import sys

SCRIPT = """
import hashlib
from ringzero.tasks import make_task
from ringzero.tasks.config import ArithmeticTask
from ringzero.tasks.corpus import CorpusGenerator
task = make_task(ArithmeticTask(digits=6, min_digits=2, verbosity="step", check_weights=[0.5, 0.5],
                                slip_rate=0.2, lookup_fraction=0.3, worked_fraction=0.2))
docs = CorpusGenerator(task).documents(200, 11)
ids = [p.id for p in task.prompts("train", 50, 3)]
print(hashlib.sha256("\\x00".join(docs + ids).encode()).hexdigest())
"""


def run(hash_seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True
    ).stdout


def test_two_hash_seeds_give_the_same_corpus_and_prompts():
    assert run("1") == run("4242") != ""

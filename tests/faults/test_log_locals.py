"""A secret held in a local variable of a call that fails never reaches a log: tracebacks in the console and
in ``log.jsonl`` show frames, not locals (``ringzero/logs.py``), unless ``--log-level debug`` asks for them.

The secret is planted where real ones live while a call fails: in a stage's own code, in the store client
(a URL's signature while it reads an object) and in the rollout server (the engine's and the tokenizer's
frames, and a weight update that fails inside the store client). Every failure is logged with its
traceback; the console, the JSON log, the answers and every file written (metrics, the store's objects)
are scanned for it. At ``--log-level debug`` the same failure does show the secret: the scan can see it."""

from __future__ import annotations

import logging
import secrets

import pytest
import requests
import structlog
import yaml

import ringzero.pipeline.execute as execute
import ringzero.rollout.server.app as server_app
from ringzero.errors import RingzeroError
from ringzero.logs import attach_run_log, setup_logging
from ringzero.pipeline.execute import execute_stage
from ringzero.rollout.server.app import RolloutServer, ServerThread
from ringzero.rollout.types import Completion
from ringzero.stages.base import StageInputs
from ringzero.store import open_store
from ringzero.store.local import LocalBackend
from ringzero.tokenizer import CharTokenizer

SECRET = "rzlocals-" + secrets.token_hex(12)
ONE = {"max_new_tokens": 1}


@pytest.fixture
def logs(tmp_path, capsys, monkeypatch):
    """Logging as ``main()`` sets it up (at the level the test asks), plus a run log; ``read()`` is every
    byte both wrote. Module loggers are fresh: one cached under another configuration would bypass it."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    for module in (execute, server_app):
        monkeypatch.setattr(module, "log", structlog.get_logger(module.__name__))

    class Logs:
        def setup(self, level: str = "info") -> None:
            setup_logging(level)
            self.path = attach_run_log(tmp_path / "run")

        def read(self) -> bytes:
            for handler in root.handlers:
                handler.flush()
            out = capsys.readouterr()
            return (out.out + out.err).encode() + self.path.read_bytes()

    yield Logs()
    for handler in root.handlers:
        if handler not in saved[0]:
            handler.close()
    root.handlers[:], root.level = saved


def assert_nowhere(blobs: dict[str, bytes]) -> None:
    found = [where for where, blob in blobs.items() if SECRET.encode() in blob]
    assert not found, f"the secret held in a local variable reached: {found}"


def written(folder) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


# --- inside a stage --------------------------------------------------------------------------------


@pytest.fixture
def stage_run(tmp_path, monkeypatch):
    """A stage of the tiny config whose runner records a metric and then fails, as ``failure`` makes it."""
    from ringzero.config import load_config

    config = tmp_path / "run.yaml"
    data = yaml.safe_load(open("configs/tiny-cpu.yaml"))
    data["run"].update(run_dir=str(tmp_path / "run"))
    data["storage"] = {"root": f"file://{tmp_path}/store"}
    config.write_text(yaml.safe_dump(data))
    cfg = load_config(config)
    store = open_store(cfg.storage.root)

    def run(failure):
        def runner(ctx, stage, inputs):
            ctx.metrics.log(1, {"loss/total": 1.0})
            failure(ctx)

        monkeypatch.setattr(execute, "get_runner", lambda kind: runner)
        with pytest.raises(Exception) as failed:
            execute_stage(cfg, store, cfg.stages[0], StageInputs(), tmp_path / "run")
        return failed.value

    return run


def fails_in_the_stage(ctx):
    api_token = SECRET  # noqa: F841 - a credential the stage's code holds when it fails
    raise ValueError("the stage's step diverged")


def fails_in_the_store_client(ctx):
    ctx.store.get_bytes("inputs/shard-0.bin")


@pytest.fixture
def planted_store(monkeypatch):
    """The file store's client fails reading an object under ``inputs/`` while it holds a URL's signature."""
    read = LocalBackend.read

    def planted(self, key):
        if "/inputs/" not in self.uri(key):
            return read(self, key)
        signature = SECRET  # noqa: F841 - what a client holds while it fetches a presigned URL
        raise RuntimeError(f"connection reset while reading {key}")

    monkeypatch.setattr(LocalBackend, "read", planted)


def test_a_stage_that_fails_logs_its_frames_not_their_locals(logs, stage_run, tmp_path):
    logs.setup()
    exc = stage_run(fails_in_the_stage)
    assert isinstance(exc, ValueError)
    text = logs.read()
    assert b"stage.failed" in text and b"fails_in_the_stage" in text  # the traceback is there, frames and all
    assert_nowhere({"logs": text, **written(tmp_path)})


def test_a_store_client_that_fails_inside_a_stage_logs_no_locals(logs, stage_run, planted_store, tmp_path):
    logs.setup()
    exc = stage_run(fails_in_the_store_client)
    assert isinstance(exc, RuntimeError)
    text = logs.read()
    assert b"connection reset while reading inputs/shard-0.bin" in text and b"planted" in text
    assert_nowhere({"logs": text, **written(tmp_path)})


def test_a_refused_stage_is_logged_by_its_message_alone(logs, stage_run):
    logs.setup()

    def refused(ctx):
        raise RingzeroError("stage refused: no init checkpoint")

    stage_run(refused)
    text = logs.read()
    assert b"stage refused: no init checkpoint" in text and b"Traceback" not in text


def test_debug_level_shows_locals_so_the_scan_can_see_them(logs, stage_run):
    logs.setup("debug")
    stage_run(fails_in_the_stage)
    assert SECRET.encode() in logs.read()


# --- inside the server -----------------------------------------------------------------------------


TOK = CharTokenizer()
CRASH, UNDECODABLE = TOK.encode("?")[0], TOK.encode("z")[0]


class PlantedEngine:
    """Continues a prompt with its last token; crashes on a '?', holding a secret; loads weights through the
    store client."""

    weight_version = "0"

    def health(self) -> bool:
        return True

    def generate(self, requests):
        if any(CRASH in r.input_ids for r in requests):
            session_key = SECRET  # noqa: F841
            raise ValueError("engine crashed")
        return [
            [Completion(list(r.input_ids), [r.input_ids[-1]], [-1.0], "length", None, self.weight_version)]
            for r in requests
        ]

    def update_weights_from_disk(self, uri: str, weight_version: str) -> None:
        from ringzero.model.checkpoint import load_model

        load_model(uri)


class PlantedTokenizer(CharTokenizer):
    """Fails to decode a 'z', holding a secret."""

    def decode(self, ids, skip_special=True):
        if UNDECODABLE in ids:
            bearer = SECRET  # noqa: F841
            raise RuntimeError("decoder broke")
        return super().decode(ids, skip_special)


def test_the_servers_failures_log_frames_not_locals(logs, planted_store, tmp_path):
    logs.setup()
    store = f"file://{tmp_path}/store"
    server = RolloutServer(PlantedEngine(), PlantedTokenizer(), model_path="planted://0")
    answers = []
    with ServerThread(server.app) as thread:
        crash = requests.post(
            thread.url + "/generate", json={"text": "a?", "sampling_params": ONE}, timeout=30
        )
        assert (crash.status_code, crash.json()["message"]) == (500, "ValueError: engine crashed")
        # the tokenizer fails while the answer is written: no handler expects that
        decode = requests.post(
            thread.url + "/generate", json={"text": "az", "sampling_params": ONE}, timeout=30
        )
        assert (decode.status_code, decode.json()["message"]) == (500, "RuntimeError: decoder broke")
        update = requests.post(
            thread.url + "/update_weights_from_disk",
            json={"model_path": f"{store}/inputs/step-1"},
            timeout=30,
        )
        assert update.status_code == 400 and "connection reset" in update.json()["message"], update.text
        answers += [crash.content, decode.content, update.content]
        assert (
            requests.post(thread.url + "/generate", json={"text": "a", "sampling_params": ONE}).status_code
            == 200
        )
    text = logs.read()
    for event in (b"rollout.engine_failed", b"rollout.request_failed", b"rollout.weight_update_failed"):
        assert event in text
    assert text.count(b"Traceback") + text.count(b'"frames"') >= 3  # each failure with its frames
    assert_nowhere({"logs": text, "answers": b"".join(answers), **written(tmp_path)})

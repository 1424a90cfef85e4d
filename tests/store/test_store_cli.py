"""``ringzero store ls|latest|gc|verify`` on a file:// store, and the progress bar's TTY rule."""

from __future__ import annotations

import sys

import pytest
import torch
from store_kit import CrashingBackend, SimulatedCrash

from ringzero.cli.main import main
from ringzero.store import CheckpointStore


@pytest.fixture
def populated(file_store):
    for step in (1, 2):
        file_store.save(f"run/step-{step}", {"w": torch.full((4,), float(step))}, {})
    crashing = CheckpointStore(CrashingBackend(file_store.backend, at=3))
    with pytest.raises(SimulatedCrash):
        crashing.save("run/step-3", {"w": torch.zeros(4)}, {})
    return file_store


def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["store", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_ls_prints_committed_uris(populated, capsys):
    code, out, _ = run(capsys, "ls", populated.uri)
    assert code == 0
    assert out.splitlines() == [populated.uri_of("run/step-1"), populated.uri_of("run/step-2")]


def test_latest_prints_the_last_committed_uri_or_fails_cleanly(populated, capsys):
    assert run(capsys, "latest", populated.uri, "--prefix", "run/")[:2] == (
        0,
        populated.uri_of("run/step-2") + "\n",
    )
    code, out, err = run(capsys, "latest", populated.uri, "--prefix", "other/")
    assert (code, out) == (2, "")
    assert err.endswith(f"error: no committed checkpoint under {populated.uri} with prefix 'other/'\n")


def test_gc_reports_what_it_removed(populated, capsys):
    code, out, _ = run(capsys, "gc", populated.uri)
    assert code == 0
    assert out.splitlines() == [
        f"removed {populated.uri_of('run/step-3')}",
        "gc: 1 uncommitted checkpoints (2 objects), 0 interrupted writes removed",
    ]
    assert not (populated.backend.root / "run" / "step-3").exists()


def test_verify_passes_intact_and_names_the_damaged_file(populated, capsys):
    uri = populated.uri_of("run/step-1")
    code, out, _ = run(capsys, "verify", uri)
    assert (code, out) == (
        0,
        f"ok: {uri}: 2 files, 1 tensors, {_size(populated, 'run/step-1')} bytes, every sha256 matches\n",
    )

    shard = populated.backend.root / "run" / "step-1" / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1] + b"\x00")
    code, out, err = run(capsys, "verify", uri)
    assert (code, out) == (2, "")
    assert f"error: {uri}/model.safetensors: sha256 mismatch: expected " in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["ls", "http://host/x"],
            "error: 'http://host/x' is not a store URI: use file://PATH or s3://BUCKET/PREFIX",
        ),
        (
            ["ls", "s3://b/p", "--endpoint", "https://host:9000"],
            "error: bad S3 settings: --endpoint: Value error, give host:port without a scheme",
        ),
        (["verify", "file:///"], "error: file:/// names no checkpoint folder"),
    ],
)
def test_bad_input_is_one_clean_line(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_progress_bar_only_on_a_terminal(file_store, capsys, monkeypatch):
    capsys.readouterr()
    file_store.save("quiet", {"w": torch.zeros(1000)}, {})
    assert "save quiet" not in capsys.readouterr().err

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    file_store.save("loud", {"w": torch.zeros(1000)}, {})
    assert "save loud" in capsys.readouterr().err


def _size(store, name) -> int:
    return sum(
        i.size for i in store.backend.list(f"{name}/") if i.key.endswith((".safetensors", "config.json"))
    )

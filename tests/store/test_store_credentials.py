"""S3 credentials come only from the environment and never show up in logs, reprs or errors."""

from __future__ import annotations

import logging

import pytest
import structlog
import torch

from ringzero.errors import StoreError
from ringzero.store import open_store
from ringzero.store.credentials import ACCESS_KEY_ENV, SECRET_KEY_ENV, credentials_from_env

ACCESS = "AKIARINGZEROTEST7QX"
SECRET = "s3cr3t/ringzero+never-shown-9f2c"


def test_plain_variables():
    creds = credentials_from_env({ACCESS_KEY_ENV: ACCESS, SECRET_KEY_ENV: SECRET})
    assert (creds.access_key, creds.secret_key) == (ACCESS, SECRET)


def test_file_variables_as_mounted_from_kubernetes_secrets(tmp_path):
    (tmp_path / "access").write_text(ACCESS + "\n")
    (tmp_path / "secret").write_text(SECRET)
    env = {
        f"{ACCESS_KEY_ENV}_FILE": str(tmp_path / "access"),
        f"{SECRET_KEY_ENV}_FILE": str(tmp_path / "secret"),
    }
    creds = credentials_from_env(env)
    assert (creds.access_key, creds.secret_key) == (ACCESS, SECRET)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {},
            rf"no S3 credentials: set {ACCESS_KEY_ENV} \(or {ACCESS_KEY_ENV}_FILE to a file holding it\); "
            r"credentials are never read from the run config",
        ),
        ({ACCESS_KEY_ENV: ACCESS}, rf"no S3 credentials: set {SECRET_KEY_ENV}"),
        (
            {ACCESS_KEY_ENV: ACCESS, f"{ACCESS_KEY_ENV}_FILE": "/x", SECRET_KEY_ENV: SECRET},
            rf"both {ACCESS_KEY_ENV} and {ACCESS_KEY_ENV}_FILE are set; set only one",
        ),
        (
            {f"{ACCESS_KEY_ENV}_FILE": "/no/such/file", SECRET_KEY_ENV: SECRET},
            rf"{ACCESS_KEY_ENV}_FILE names '/no/such/file', which cannot be read: No such file or directory",
        ),
    ],
)
def test_missing_or_ambiguous_credentials_are_clear_errors(env, message):
    with pytest.raises(StoreError, match=message):
        credentials_from_env(env)


def test_an_empty_secret_file_is_refused(tmp_path):
    (tmp_path / "empty").write_text("\n")
    env = {ACCESS_KEY_ENV: ACCESS, f"{SECRET_KEY_ENV}_FILE": str(tmp_path / "empty")}
    with pytest.raises(StoreError, match=rf"{SECRET_KEY_ENV}_FILE names '.*empty', which is empty"):
        credentials_from_env(env)


def test_opening_an_s3_store_without_credentials_fails_before_any_request(monkeypatch):
    for var in (ACCESS_KEY_ENV, SECRET_KEY_ENV):
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(f"{var}_FILE", raising=False)
    with pytest.raises(StoreError, match=rf"no S3 credentials: set {ACCESS_KEY_ENV}"):
        open_store("s3://bucket/prefix")


def test_credentials_repr_is_masked():
    creds = credentials_from_env({ACCESS_KEY_ENV: ACCESS, SECRET_KEY_ENV: SECRET})
    assert repr(creds) == str(creds) == "S3Credentials(access_key=***, secret_key=***)"
    assert creds.scrub(f"key {ACCESS} and {SECRET}.") == "key *** and ***."


@pytest.mark.s3
@pytest.mark.xdist_group("store-moto")
def test_secrets_never_reach_logs_reprs_or_errors(moto_target, monkeypatch, caplog, capsys):
    monkeypatch.setenv(ACCESS_KEY_ENV, ACCESS)
    monkeypatch.setenv(SECRET_KEY_ENV, SECRET)
    caplog.set_level(logging.DEBUG)  # urllib3, minio and everything else at their most talkative
    bucket = moto_target.new_bucket()
    shown: list[str] = []
    with structlog.testing.capture_logs() as events:
        store = open_store(f"s3://{bucket}/x", moto_target.settings())
        uri = store.save("c", {"w": torch.ones(3)}, {"k": 1})
        store.load(uri)
        store.latest()
        store.put_json("d.json", {"a": 1})
        store.gc_uncommitted()
        shown += [repr(store), repr(store.backend), repr(vars(store.backend))]
        for failing in (
            lambda: open_store(f"s3://no-such-bucket-{bucket}/x", moto_target.settings()),
            lambda: store.load("missing"),
            lambda: (moto_target.kill(), store.list()),  # retried, logged, then given up
        ):
            try:
                failing()
            except StoreError as exc:
                shown += [str(exc), repr(exc)]
        moto_target.restart()
    out = capsys.readouterr()
    shown += [repr(events), caplog.text, out.out, out.err]

    everything = "\n".join(shown)
    assert "store.retry" in everything and "does not exist" in everything  # the capture did see the failures
    assert ACCESS not in everything
    assert SECRET not in everything

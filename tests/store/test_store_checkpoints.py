"""Saving, loading, listing and naming checkpoints, on file:// and on s3:// (moto)."""

from __future__ import annotations

import json

import pytest
import torch
from store_kit import assert_bit_exact

from ringzero.errors import StoreError
from ringzero.store import load_checkpoint, open_store
from ringzero.store.manifest import COMMIT_FILE, CONFIG_FILE, MANIFEST_FILE, STARTED_FILE
from ringzero.store.uri import parse_uri


def small_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {
        "embed.weight": torch.randn(40, 8, generator=g),  # 1280 bytes: a shard of its own at 1024
        "layers.0.attn.w_q": torch.randn(8, 8, generator=g).to(torch.bfloat16),
        "layers.0.norm": torch.ones(8, dtype=torch.float16),
        "layers.0.decay": torch.tensor([-0.5, float("nan"), float("inf")], dtype=torch.float64),
        "mask": torch.tensor([True, False, True]),
        "empty": torch.empty(0, 3),
        "step": torch.tensor(12, dtype=torch.int64),
    }


def test_round_trip_is_bit_exact_with_config_and_meta(any_store):
    tensors = small_state()
    config = {"hidden_size": 8, "layer_types": ["mla", "lightning"], "rope_theta": 10000.0, "name": "tiny ✓"}
    uri = any_store.save("run1/step-000012", tensors, config, meta={"step": 12, "loss": 1.25})

    assert uri == f"{any_store.uri}/run1/step-000012"
    ckpt = any_store.load(uri)
    assert_bit_exact(ckpt.tensors, tensors)
    assert ckpt.config == config
    assert ckpt.meta == {"step": 12, "loss": 1.25}
    assert ckpt.uri == uri
    assert_bit_exact(any_store.load("run1/step-000012").tensors, tensors)  # by name too


def test_state_dict_is_split_into_shards_no_larger_than_the_limit_unless_one_tensor_is(any_store):
    tensors = {f"w{i}": torch.full((100,), float(i)) for i in range(5)}  # 400 bytes each
    tensors["huge"] = torch.zeros(600)  # 2400 bytes, more than the 1024-byte limit
    name = any_store.name_of(any_store.save("sharded", tensors, {}))

    manifest = json.loads(any_store.backend.read(f"{name}/{MANIFEST_FILE}"))
    shards = {f: e["tensors"] for f, e in manifest["files"].items() if f.endswith(".safetensors")}
    assert list(shards.values()) == [["w0", "w1"], ["w2", "w3"], ["w4"], ["huge"]]
    assert_bit_exact(any_store.load(name).tensors, tensors)


def test_folder_holds_shards_config_manifest_and_commit_marker(file_store):
    uri = file_store.save("c", {"a": torch.zeros(4)}, {"k": 1})
    folder = file_store.backend.root / "c"
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [STARTED_FILE, "model.safetensors", CONFIG_FILE, MANIFEST_FILE, COMMIT_FILE]
    )
    assert json.loads((folder / CONFIG_FILE).read_text()) == {"k": 1}  # plain config.json, as HF tools expect
    assert uri == f"file://{folder}"


def test_tied_and_non_contiguous_tensors_are_stored_as_independent_tensors(any_store):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    tensors = {"a": base, "tied": base, "view": base[1:3], "transposed": base.t()}
    ckpt = any_store.load(any_store.save("tied", tensors, {}))
    assert_bit_exact(ckpt.tensors, {k: v.contiguous() for k, v in tensors.items()})
    ckpt.tensors["a"][0, 0] = -1
    assert ckpt.tensors["tied"][0, 0] == 0


def test_list_and_latest_see_committed_checkpoints_by_prefix(any_store):
    for step in (10, 30, 20):  # committed in this order
        any_store.save(f"run1/step-{step:06d}", {"x": torch.tensor(step)}, {})
    any_store.save("run2/step-000005", {"x": torch.tensor(5)}, {})

    assert any_store.list("run1/") == [f"{any_store.uri}/run1/step-{s:06d}" for s in (10, 20, 30)]
    assert len(any_store.list()) == 4
    assert (
        any_store.latest("run1/step-") == f"{any_store.uri}/run1/step-000020"
    )  # last committed, not greatest name
    assert any_store.latest() == f"{any_store.uri}/run2/step-000005"
    assert any_store.latest("run3/") is None
    assert any_store.list("run3/") == []


def test_saving_over_a_committed_checkpoint_is_refused_and_leaves_it_intact(any_store):
    first = {"w": torch.ones(3)}
    uri = any_store.save("final", first, {"v": 1})
    with pytest.raises(StoreError, match=r"already committed; checkpoints are immutable"):
        any_store.save("final", {"w": torch.zeros(3)}, {"v": 2})
    ckpt = any_store.load(uri)
    assert_bit_exact(ckpt.tensors, first)
    assert ckpt.config == {"v": 1}


def test_saving_inside_a_committed_checkpoint_is_refused(any_store):
    any_store.save("outer", {"w": torch.ones(1)}, {})
    with pytest.raises(StoreError, match=r"cannot save 'outer/inner' inside committed checkpoint .*outer"):
        any_store.save("outer/inner", {"w": torch.ones(1)}, {})
    any_store.save("a/b", {"w": torch.ones(1)}, {})
    with pytest.raises(StoreError, match=r"cannot save 'a': it holds committed checkpoint .*a/b"):
        any_store.save("a", {"w": torch.ones(1)}, {})


def test_saving_over_a_folder_of_other_objects_is_refused(any_store):
    any_store.put_json("runs/r1/manifest.json", {"status": "running"})
    with pytest.raises(
        StoreError, match=r"holds objects that are not a checkpoint, e.g. runs/r1/manifest.json"
    ):
        any_store.save("runs/r1", {"w": torch.ones(1)}, {})
    assert any_store.get_json("runs/r1/manifest.json") == {"status": "running"}


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", r"checkpoint name must be a non-empty string"),
        ("../escape", r"segment '\.\.' is not allowed"),
        ("a//b", r"segment '' is not allowed"),
        ("/abs", r"segment '' is not allowed"),
        ("run 1", r"segment 'run 1' is not allowed"),
        (".hidden", r"segment '\.hidden' is not allowed"),
    ],
)
def test_bad_checkpoint_names_are_refused(file_store, name, message):
    with pytest.raises(StoreError, match=message):
        file_store.save(name, {"w": torch.ones(1)}, {})
    assert not file_store.backend.root.exists() or not any(file_store.backend.root.rglob("*"))


@pytest.mark.parametrize(
    ("tensors", "config", "meta", "message"),
    [
        ({"w": [1, 2]}, {}, None, r"tensor 'w': expected a torch.Tensor, got list"),
        ({"__metadata__": torch.ones(1)}, {}, None, r"'__metadata__' is reserved"),
        ({"\ud800": torch.ones(1)}, {}, None, r"cannot be encoded as UTF-8"),
        ({"s": torch.ones(2).to_sparse()}, {}, None, r"tensor 's': layout torch.sparse_coo cannot be stored"),
        (
            {"c": torch.ones(2, dtype=torch.complex128)},
            {},
            None,
            r"tensor 'c': dtype torch.complex128 cannot be stored",
        ),
        (
            {"w": torch.ones(1)},
            {"lr": float("nan")},
            None,
            r"config is not JSON-serializable: Out of range float",
        ),
        ({"w": torch.ones(1)}, {"dtype": torch.float32}, None, r"config is not JSON-serializable: .*dtype"),
        ({"w": torch.ones(1)}, ["not", "a", "dict"], None, r"config must be a dict \(got list\)"),
        ({"w": torch.ones(1)}, {}, {"t": object()}, r"meta is not JSON-serializable"),
    ],
)
def test_bad_contents_are_refused_before_anything_is_written(file_store, tensors, config, meta, message):
    with pytest.raises(StoreError, match=message):
        file_store.save("bad", tensors, config, meta)
    assert file_store.list() == []
    assert not (file_store.backend.root / "bad").exists()


def test_load_accepts_names_and_uris_under_the_root_only(file_store, tmp_path):
    uri = file_store.save("x/y", {"w": torch.ones(1)}, {})
    assert file_store.load(uri).uri == uri
    with pytest.raises(StoreError, match=r"is not under this store's root"):
        file_store.load(f"file://{tmp_path}/elsewhere/x/y")
    with pytest.raises(StoreError, match=r"no committed checkpoint at .*/x/z$"):
        file_store.load("x/z")


def test_load_checkpoint_opens_the_store_from_a_full_uri(tmp_path, monkeypatch):
    tensors = {"w": torch.arange(5)}
    uri = open_store(f"file://{tmp_path}/root").save("deep/name", tensors, {"a": 1})
    assert_bit_exact(load_checkpoint(uri).tensors, tensors)
    monkeypatch.chdir(tmp_path)  # relative file:// roots resolve against the working folder
    assert load_checkpoint("file://root/deep/name").config == {"a": 1}
    with pytest.raises(StoreError, match=r"is not a store URI"):
        load_checkpoint("http://example/x")


def test_checkpoint_repr_summarises_instead_of_printing_tensors(file_store):
    ckpt = file_store.load(file_store.save("r", {"w": torch.zeros(1000)}, {}))
    assert repr(ckpt) == f"Checkpoint({ckpt.uri}, 1 tensors, 4000 bytes)"


@pytest.mark.parametrize(
    ("uri", "root", "name"),
    [
        ("s3://bucket/runs/r1/step-1", "s3://bucket/runs/r1", "step-1"),
        ("s3://bucket/step-1/", "s3://bucket", "step-1"),
        ("file:///data/store/ck", "file:///data/store", "ck"),
        ("file:///ck", "file:///", "ck"),
        ("file:///data/./store/../ck", "file:///data", "ck"),
    ],
)
def test_a_checkpoint_uri_splits_into_its_store_root_and_name(uri, root, name):
    parent, last = parse_uri(uri).parent()
    assert (str(parent), last) == (root, name)

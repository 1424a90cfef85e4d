"""A committed checkpoint folder is a Hugging Face model folder: shard names, the index, extra files,
and export to / import from plain local folders."""

from __future__ import annotations

import json
import os

import pytest
import safetensors.torch
import torch
from ci_require import require_module
from store_kit import assert_bit_exact

from ringzero.errors import IntegrityError, StoreError
from ringzero.store.layout import BOOKKEEPING_FILES, INDEX_FILE, SINGLE_SHARD_FILE
from ringzero.store.manifest import COMMIT_FILE, MANIFEST_FILE, Commit, FileEntry, sha256_hex

THREE_SHARDS = {
    "b.w": torch.arange(200, dtype=torch.float32),
    "a.w": torch.ones(200),
    "c.w": torch.zeros(100),
}
EXTRAS = {
    "generation_config.json": json.dumps({"eos_token_id": 2}).encode(),
    "tokenizer.json": json.dumps({"model": {"type": "BPE"}}).encode(),
    "tokenizer_config.json": b'{"model_max_length": 4096}',
}
CONFIG = {"architectures": ["BailingMoeV2_5ForCausalLM"], "hidden_size": 8}


def manifest_files(store, name) -> dict:
    return json.loads(store.backend.read(f"{name}/{MANIFEST_FILE}"))["files"]


def recommit(store, name, files: dict) -> None:
    """Rewrite the manifest's file list and commit it again: a buggy writer rather than bit rot."""
    doc = json.loads(store.backend.read(f"{name}/{MANIFEST_FILE}"))
    doc["files"] = files
    data = json.dumps(doc).encode()
    store.backend.write(f"{name}/{MANIFEST_FILE}", data)
    store.backend.write(f"{name}/{COMMIT_FILE}", Commit(FileEntry(len(data), sha256_hex(data)), 1).to_bytes())


# -- names and the index -------------------------------------------------------------------------


def test_one_shard_is_model_safetensors_without_an_index(any_store):
    name = any_store.name_of(any_store.save("one", {"w": torch.ones(3)}, CONFIG))
    assert list(manifest_files(any_store, name)) == [SINGLE_SHARD_FILE, "config.json"]
    assert not any_store.backend.exists(f"{name}/{INDEX_FILE}")


def test_several_shards_are_numbered_from_one_with_a_transformers_index(any_store):
    name = any_store.name_of(any_store.save("three", THREE_SHARDS, CONFIG))
    shards = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    files = manifest_files(any_store, name)
    assert list(files) == [*shards, INDEX_FILE, "config.json"]

    data = any_store.backend.read(f"{name}/{INDEX_FILE}")
    assert files[INDEX_FILE] == {"size": len(data), "sha256": sha256_hex(data)}
    index = json.loads(data)
    assert index == {
        "metadata": {"total_size": 2000},
        "weight_map": {"a.w": shards[1], "b.w": shards[0], "c.w": shards[2]},
    }
    assert list(index["weight_map"]) == sorted(index["weight_map"])  # sorted keys, as transformers writes it
    assert data.endswith(b"}\n")


def test_an_index_that_disagrees_with_the_manifest_is_refused(any_store):
    name = any_store.name_of(any_store.save("three", THREE_SHARDS, CONFIG))
    bad = json.dumps({"metadata": {}, "weight_map": {"a.w": "model-00001-of-00003.safetensors"}}).encode()
    any_store.backend.write(f"{name}/{INDEX_FILE}", bad)
    files = manifest_files(any_store, name)
    files[INDEX_FILE] = {"size": len(bad), "sha256": sha256_hex(bad)}
    recommit(any_store, name, files)
    for read in (any_store.load, any_store.verify):
        with pytest.raises(IntegrityError) as refused:
            read(name)
        assert str(refused.value) == (
            f"{any_store.backend.uri(name)}/{INDEX_FILE}: disagrees with the manifest: "
            "model-00002-of-00003.safetensors is not in the index; model-00003-of-00003.safetensors is not "
            "in the "
            "index; tensor 'b.w' in model-00001-of-00003.safetensors is not in the index"
        )


def test_shards_carry_the_pt_format_header_transformers_checks(file_store):
    file_store.save("one", {"w": torch.ones(3)}, CONFIG)
    with safetensors.safe_open(file_store.backend.root / "one" / SINGLE_SHARD_FILE, framework="pt") as f:
        assert f.metadata() == {"format": "pt"}


# -- extra files ---------------------------------------------------------------------------------


def test_extra_files_round_trip_listed_in_the_manifest(any_store):
    uri = any_store.save("ex", THREE_SHARDS, CONFIG, {"step": 3}, extra_files=EXTRAS)
    name = any_store.name_of(uri)
    files = manifest_files(any_store, name)
    for fname, data in EXTRAS.items():
        assert files[fname] == {"size": len(data), "sha256": sha256_hex(data)}
    ckpt = any_store.load(uri)
    assert ckpt.files == EXTRAS
    assert (ckpt.config, ckpt.meta) == (CONFIG, {"step": 3})
    assert_bit_exact(ckpt.tensors, THREE_SHARDS)
    assert any_store.read_file(uri, "generation_config.json") == EXTRAS["generation_config.json"]
    assert any_store.load(any_store.save("plain", {"w": torch.ones(1)}, {})).files == {}


def test_a_corrupted_extra_file_is_refused_by_name(any_store):
    name = any_store.name_of(any_store.save("ex", {"w": torch.ones(2)}, CONFIG, extra_files=EXTRAS))
    key = f"{name}/tokenizer.json"
    any_store.backend.write(key, any_store.backend.read(key).replace(b"BPE", b"XYZ"))
    for read in (any_store.load, any_store.verify, lambda n: any_store.read_file(n, "tokenizer.json")):
        with pytest.raises(
            IntegrityError, match=rf"^{any_store.backend.uri(key)}: sha256 mismatch: expected "
        ):
            read(name)
    assert any_store.read_file(name, "generation_config.json") == EXTRAS["generation_config.json"]
    with pytest.raises(StoreError, match=r"has no file 'chat_template.jinja'; it holds \['config.json', "):
        any_store.read_file(name, "chat_template.jinja")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"sub/tokenizer.json": b""},
            r"extra file 'sub/tokenizer.json': must be a plain file name, without '/'",
        ),
        ({".hidden": b""}, r"extra file '\.hidden': not a plain file name"),
        ({"my file.txt": b""}, r"extra file 'my file.txt': not a plain file name"),
        ({"": b""}, r"extra file names must be non-empty strings"),
        (
            {"config.json": b"{}"},
            r"extra file 'config.json': the name is reserved for the checkpoint's own files",
        ),
        ({"manifest.json": b"{}"}, r"extra file 'manifest.json': the name is reserved"),
        ({"COMMITTED": b""}, r"extra file 'COMMITTED': the name is reserved"),
        ({"Started": b""}, r"extra file 'Started': the name is reserved"),
        (
            {"model.safetensors": b""},
            r"extra file 'model.safetensors': the name is reserved for the checkpoint's "
            r"weights",
        ),
        (
            {"model-00001-of-00002.safetensors": b""},
            r"'model-00001-of-00002.safetensors': the name is reserved",
        ),
        (
            {INDEX_FILE: b"{}"},
            r"extra file 'model.safetensors.index.json': the name is reserved for the "
            r"checkpoint's weights",
        ),
        ({"tokenizer.json": "{}"}, r"extra file 'tokenizer.json': expected bytes, got str"),
        ([("tokenizer.json", b"")], r"extra_files must be a dict of file name -> bytes \(got list\)"),
    ],
)
def test_bad_extra_files_are_refused_before_anything_is_written(file_store, extra, message):
    with pytest.raises(StoreError, match=message):
        file_store.save("bad", {"w": torch.ones(1)}, {}, extra_files=extra)
    assert not (file_store.backend.root / "bad").exists()


# -- export --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tensors", [{"w": torch.arange(6.0).reshape(2, 3)}, THREE_SHARDS], ids=["single", "sharded"]
)
def test_export_writes_a_plain_folder_that_hf_readers_load(any_store, tmp_path, tensors):
    uri = any_store.save("ck", tensors, CONFIG, {"step": 1}, extra_files=EXTRAS)
    out = tmp_path / "models" / "policy"

    names = any_store.export_folder(uri, out)

    assert sorted(os.listdir(out)) == names
    assert not set(names) & BOOKKEEPING_FILES
    assert names == sorted([*manifest_files(any_store, any_store.name_of(uri))])
    assert json.load(open(out / "config.json")) == CONFIG
    for fname, data in EXTRAS.items():
        assert (out / fname).read_bytes() == data
    if INDEX_FILE in names:
        weight_map = json.load(open(out / INDEX_FILE))["weight_map"]
        loaded = {}
        for shard in sorted(set(weight_map.values())):
            loaded.update(safetensors.torch.load_file(out / shard))
        assert {t: weight_map[t] for t in loaded} == weight_map
    else:
        loaded = safetensors.torch.load_file(out / SINGLE_SHARD_FILE)
    assert_bit_exact({k: loaded[k] for k in tensors}, tensors)
    assert [p.name for p in out.parent.iterdir()] == ["policy"]  # no temporary folder left beside it


def test_export_into_an_existing_empty_folder_replaces_it(file_store, tmp_path):
    uri = file_store.save("ck", {"w": torch.ones(2)}, CONFIG)
    (tmp_path / "out").mkdir()
    assert file_store.export_folder(uri, tmp_path / "out") == ["config.json", SINGLE_SHARD_FILE]


def test_export_refuses_a_non_empty_or_non_folder_target_naming_it(file_store, tmp_path):
    uri = file_store.save("ck", {"w": torch.ones(2)}, CONFIG)
    full = tmp_path / "full"
    full.mkdir()
    (full / "old.bin").write_bytes(b"x")
    with pytest.raises(StoreError, match=rf"cannot export to {full}: the folder exists and is not empty"):
        file_store.export_folder(uri, full)
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(
        StoreError, match=rf"cannot export to {tmp_path / 'file'}: it exists and is not a folder"
    ):
        file_store.export_folder(uri, tmp_path / "file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "full", "store"]


def test_export_of_a_corrupted_shard_is_refused_and_leaves_nothing(any_store, tmp_path):
    name = any_store.name_of(any_store.save("ck", THREE_SHARDS, CONFIG))
    key = f"{name}/model-00003-of-00003.safetensors"
    data = bytearray(any_store.backend.read(key))
    data[-1] ^= 0xFF
    any_store.backend.write(key, bytes(data))
    (tmp_path / "out").mkdir()
    with pytest.raises(IntegrityError, match=rf"^{any_store.backend.uri(key)}: sha256 mismatch"):
        any_store.export_folder(name, tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir() if p.name != "store"] == ["out"]
    assert not any((tmp_path / "out").iterdir())


def test_export_refuses_uncommitted_checkpoints_and_older_layouts(file_store, tmp_path):
    with pytest.raises(StoreError, match=r"no committed checkpoint at .*/nothing"):
        file_store.export_folder("nothing", tmp_path / "out")
    name = file_store.name_of(file_store.save("old", {"w": torch.ones(2)}, CONFIG))
    files = manifest_files(file_store, name)
    os.rename(
        file_store.backend.root / name / SINGLE_SHARD_FILE,
        file_store.backend.root / name / "shard-00000.safetensors",
    )
    files = {("shard-00000.safetensors" if k == SINGLE_SHARD_FILE else k): v for k, v in files.items()}
    recommit(file_store, name, files)
    assert list(file_store.load(name).tensors) == ["w"]  # still loads
    with pytest.raises(
        StoreError,
        match=r"/old is not a Hugging Face model folder: its weights are "
        r"\['shard-00000.safetensors'\] without model.safetensors.index.json, "
        r"expected \['model.safetensors'\]",
    ):
        file_store.export_folder(name, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# -- import --------------------------------------------------------------------------------------


def hf_folder(path, shards: dict[str, dict[str, torch.Tensor]], index: dict | None = None, **files: bytes):
    """A folder as transformers and hub downloads leave it: safetensors files, an index, config, extras."""
    path.mkdir(parents=True, exist_ok=True)
    for fname, tensors in shards.items():
        safetensors.torch.save_file(tensors, path / fname, metadata={"format": "pt"})
    if index is not None:
        (path / INDEX_FILE).write_text(json.dumps(index))
    (path / "config.json").write_text(json.dumps(CONFIG))
    for fname, data in files.items():
        (path / fname.replace("__", ".")).write_bytes(data)
    return path


SHARDED = {
    "model-00001-of-00002.safetensors": {"embed": torch.randn(4, 3), "layers.0.w": torch.randn(3, 3)},
    "model-00002-of-00002.safetensors": {"lm_head": torch.randn(3, 4).to(torch.bfloat16)},
}


def weight_map_of(shards) -> dict:
    return {"metadata": {"total_size": 0}, "weight_map": {t: f for f, ts in shards.items() for t in ts}}


def test_import_of_a_sharded_folder_commits_tensors_config_and_known_extras(any_store, tmp_path):
    folder = hf_folder(
        tmp_path / "hf",
        SHARDED,
        weight_map_of(SHARDED),
        tokenizer__json=b'{"t": 1}',
        chat_template__jinja=b"{{ messages }}",
        README__md=b"# a model",
    )
    uri = any_store.import_folder(folder, "base", meta={"source": "hub"})
    ckpt = any_store.load(uri)
    assert_bit_exact(ckpt.tensors, {k: v for shard in SHARDED.values() for k, v in shard.items()})
    assert (ckpt.config, ckpt.meta) == (CONFIG, {"source": "hub"})
    assert ckpt.files == {"tokenizer.json": b'{"t": 1}', "chat_template.jinja": b"{{ messages }}"}


def test_import_then_export_gives_back_a_loadable_folder(file_store, tmp_path):
    single = {"w": torch.arange(12, dtype=torch.int32).reshape(3, 4)}
    folder = hf_folder(tmp_path / "hf", {SINGLE_SHARD_FILE: single}, generation_config__json=b"{}")
    out = tmp_path / "out"
    file_store.export_folder(file_store.import_folder(folder, "base"), out)
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", SINGLE_SHARD_FILE]
    assert_bit_exact(safetensors.torch.load_file(out / SINGLE_SHARD_FILE), single)


@pytest.mark.parametrize(
    ("shards", "index", "message"),
    [
        (
            SHARDED,
            {
                "weight_map": {
                    **weight_map_of(SHARDED)["weight_map"],
                    "extra": "model-00003-of-00003.safetensors",
                }
            },
            r"model.safetensors.index.json does not fit the shards: the index names "
            r"model-00003-of-00003.safetensors, "
            r"which is missing",
        ),
        (
            {**SHARDED, "model-00003-of-00003.safetensors": {"embed": torch.zeros(1)}},
            {"weight_map": weight_map_of(SHARDED)["weight_map"]},
            r"model-00003-of-00003.safetensors is not in the index; tensor 'embed' is in two shards: "
            r"model-00001-of-00002.safetensors, model-00003-of-00003.safetensors",
        ),
        (
            SHARDED,
            {
                "weight_map": {
                    "embed": "model-00002-of-00002.safetensors",
                    "layers.0.w": "model-00001-of-00002.safetensors",
                    "lm_head": "model-00002-of-00002.safetensors",
                }
            },
            r"tensor 'embed' is in model-00001-of-00002.safetensors, the index puts it in "
            r"model-00002-of-00002.safetensors",
        ),
        (
            SHARDED,
            {
                "weight_map": {
                    **weight_map_of(SHARDED)["weight_map"],
                    "ghost": "model-00002-of-00002.safetensors",
                }
            },
            r"the index puts tensor 'ghost' in model-00002-of-00002.safetensors, which does not hold it",
        ),
        (SHARDED, {"weights": {}}, r"model.safetensors.index.json: not a safetensors index"),
        (
            SHARDED,
            None,
            r"without model.safetensors.index.json the weights must be one model.safetensors, found "
            r"\['model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors'\]",
        ),
        ({}, None, r"it has no \*.safetensors weights"),
    ],
    ids=["missing-file", "two-shards", "misplaced", "ghost", "no-weight-map", "no-index", "no-weights"],
)
def test_import_refuses_inconsistent_folders_naming_each_problem(
    file_store, tmp_path, shards, index, message
):
    folder = hf_folder(tmp_path / "hf", shards, index)
    with pytest.raises(StoreError, match=message):
        file_store.import_folder(folder, "base")
    assert file_store.list() == []


def test_import_refuses_a_folder_without_config_or_with_a_broken_one(file_store, tmp_path):
    folder = hf_folder(tmp_path / "hf", {SINGLE_SHARD_FILE: {"w": torch.ones(1)}})
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(StoreError, match=r"config.json: expected a JSON object, found list"):
        file_store.import_folder(folder, "base")
    (folder / "config.json").unlink()
    with pytest.raises(StoreError, match=rf"cannot import {folder}: it has no config.json"):
        file_store.import_folder(folder, "base")
    with pytest.raises(StoreError, match=r"not a folder"):
        file_store.import_folder(tmp_path / "nowhere", "base")
    (folder / "config.json").write_text("{}")
    (folder / SINGLE_SHARD_FILE).write_bytes(b"not safetensors")
    with pytest.raises(StoreError, match=r"model.safetensors: not a readable safetensors file"):
        file_store.import_folder(folder, "base")
    assert file_store.list() == []
    assert not (file_store.backend.root / "base").exists()


# -- transformers itself -------------------------------------------------------------------------


@pytest.mark.transformers
def test_transformers_loads_an_exported_folder_and_its_save_pretrained_imports(file_store, tmp_path):
    transformers = require_module("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    generation = model.generation_config.to_json_string().encode()
    uri = file_store.save(
        "llama", model.state_dict(), cfg.to_dict(), extra_files={"generation_config.json": generation}
    )
    assert len(file_store.verify(uri).shards) > 1  # 4 KiB shards: the index is what transformers follows

    file_store.export_folder(uri, tmp_path / "out")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert_bit_exact(reloaded.state_dict(), model.state_dict())

    model.save_pretrained(tmp_path / "hf", max_shard_size="5KB")
    ckpt = file_store.load(file_store.import_folder(tmp_path / "hf", "imported"))
    assert_bit_exact({k: ckpt.tensors[k] for k in model.state_dict()}, model.state_dict())
    assert list(ckpt.files) == ["generation_config.json"]

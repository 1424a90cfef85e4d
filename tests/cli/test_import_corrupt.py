"""``ringzero import`` on a corrupt folder: exit code 2 and one line naming the file and what is wrong, no
traceback and nothing committed; the intact folder imports."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from safetensors import safe_open

from ringzero.cli.main import main
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.hf_folder import write_folder
from ringzero.model.hybrid import HybridLM

SHARD = "model-00001-of-00001.safetensors"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    cfg = ModelConfig(num_experts=4, n_group=2, first_k_dense_replace=1)
    folder = tmp_path_factory.mktemp("export") / "ling"
    write_folder(folder, cfg, HybridLM(cfg, PrecisionPolicy.preset("fp32")).state_dict())
    return folder


def _config(change):
    def edit(d: Path) -> str:
        doc = json.loads((d / "config.json").read_text())
        change(doc)
        (d / "config.json").write_text(json.dumps(doc))
        return "config.json"

    return edit


def _raw_config(text: str):
    def edit(d: Path) -> str:
        (d / "config.json").write_text(text)
        return "config.json"

    return edit


def _weights(change):
    def edit(d: Path) -> str:
        file = d / "model.safetensors"
        file.write_bytes(change(file.read_bytes()))
        return "model.safetensors"

    return edit


def _header(change):
    """Edit the first tensor's header entry, keeping the data as it is."""

    def rewrite(data: bytes) -> bytes:
        n = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8 : 8 + n])
        change(header[next(k for k in header if k != "__metadata__")])
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        return struct.pack("<Q", len(raw)) + raw + data[8 + n :]

    return _weights(rewrite)


def _index(change):
    def edit(d: Path) -> str:
        (d / "model.safetensors").rename(d / SHARD)
        with safe_open(str(d / SHARD), "pt") as f:
            names = list(f.keys())
        doc = {"metadata": {}, "weight_map": {n: SHARD for n in names}}
        change(doc, names)
        (d / "model.safetensors.index.json").write_text(json.dumps(doc))
        return "model.safetensors.index.json"

    return edit


CASES = {
    "config not JSON": (_raw_config("{nope"), "not valid JSON"),
    "config nested too deeply": (_raw_config("[" * 5000 + "]" * 5000), "nested too deeply"),
    "config a list": (_raw_config("[1]"), "expected a JSON object"),
    "architectures an int": (_config(lambda c: c.update(architectures=5)), "architectures must be a list"),
    "architectures a string": (
        _config(lambda c: c.update(architectures="xBailingMoeV2_5ForCausalLMx")),
        "architectures must be a list",
    ),
    "layers a string": (
        _config(lambda c: c.update(num_hidden_layers="two")),
        "num_hidden_layers must be an integer",
    ),
    "ringzero a list": (_config(lambda c: c.update(ringzero=[1, 2])), "ringzero must be an object"),
    "first_k_dense_replace a string": (
        _config(lambda c: c.update(num_experts=1, first_k_dense_replace="a")),
        "first_k_dense_replace must be an integer",
    ),
    "vocab negative": (_config(lambda c: c.update(vocab_size=-1)), "vocab_size"),
    "weights empty": (_weights(lambda b: b""), "shorter than the 8-byte header size"),
    "header size past the file": (
        _weights(lambda b: struct.pack("<Q", 2**60) + b"{}"),
        "truncated or not safetensors",
    ),
    "header torn": (_weights(lambda b: b[:50]), "truncated or not safetensors"),
    "header not JSON": (_weights(lambda b: struct.pack("<Q", 8) + b"{nope!!}"), "header is not valid JSON"),
    "data truncated": (_weights(lambda b: b[:-100]), "file truncated?"),
    "dtype integer": (_header(lambda e: e.update(dtype="I64")), "dtype I64; model weights must be one of"),
    "dtype unknown": (_header(lambda e: e.update(dtype="Q9")), "unknown dtype 'Q9'"),
    "shape disagrees with the data": (
        _header(lambda e: e.update(shape=[1, 1])),
        "needs 4 bytes but data_offsets",
    ),
    "shape not sizes": (_header(lambda e: e.update(shape=["a"])), "is not a list of sizes"),
    "index misses a tensor": (
        _index(lambda doc, names: doc["weight_map"].pop(names[0])),
        "is not in the index",
    ),
    "index names a ghost tensor": (
        _index(lambda doc, names: doc["weight_map"].update({"model.ghost": SHARD})),
        "does not hold it",
    ),
    "index names a missing shard": (
        _index(lambda doc, names: doc["weight_map"].update({names[0]: "other.safetensors"})),
        "not in the folder",
    ),
    "index reaches outside the folder": (
        _index(lambda doc, names: doc["weight_map"].update({names[0]: "../elsewhere/model.safetensors"})),
        "outside the folder",
    ),
    "index not JSON": (_index(lambda doc, names: doc.update(weight_map=[1])), "not a safetensors index"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_corrupt_folder_is_refused_naming_file_and_problem(base, tmp_path, capsys, case):
    corrupt, why = CASES[case]
    folder = tmp_path / "ling"
    shutil.copytree(base, folder)
    file = corrupt(folder)
    store = tmp_path / "store"
    assert main(["import", str(folder), "--to", f"file://{store}/imported"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert file in err and why in err, err
    assert not (store / "imported").exists()


def test_the_intact_folder_imports(base, tmp_path, capsys):
    assert main(["import", str(base), "--to", f"file://{tmp_path}/store/imported"]) == 0
    assert "imported" in capsys.readouterr().out

"""Code hygiene that a reader relies on: no private name crosses a module boundary, every dotted
``ringzero.`` name and every repository path the docs and docstrings cite exists, and bench/ and tests/
stay apart (bench shares fixtures through ``bench/common.py`` only, neither reaches into the other, and
nothing edits ``sys.path``)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [
    p for d in ("ringzero", "bench", "components", "pipelines") for p in sorted((ROOT / d).rglob("*.py"))
]
DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]


def private_imports(path: Path, root: Path = ROOT) -> list[str]:
    """``from X import _name``: a private name taken from another module (a package's own submodule
    included: private means the module's own)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    out.append(
                        f"{path.relative_to(root)}:{node.lineno} imports {alias.name} from {node.module}"
                    )
    return out


def test_the_private_import_detector_sees_one(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from __future__ import annotations\nfrom a.b import _hidden, shown\n")
    assert private_imports(f, tmp_path) == ["m.py:2 imports _hidden from a.b"]


def test_no_private_name_is_imported_across_modules():
    assert [hit for path in SOURCES for hit in private_imports(path)] == []


DOTTED = re.compile(r"(?<![\"'\w.])ringzero(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def resolves(dotted: str) -> bool:
    """A module, or an attribute chain on the longest importable prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def cited_names() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in [*(p for p in SOURCES if p.is_relative_to(ROOT / "ringzero")), *DOCS]:
        for name in DOTTED.findall(path.read_text()):
            name = name.rstrip(".")
            top = ROOT / "ringzero" / name.split(".")[1]
            if not (top.is_dir() or top.with_suffix(".py").is_file()):
                continue  # a label or chart name (``ringzero.dev/stage``, ``ringzero.fullname``), not code
            if name.startswith("ringzero.engines.megatron."):
                continue  # imports megatron-core, an optional extra; its files are checked by path below
            out.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return out


def test_every_dotted_ringzero_name_in_docs_and_docstrings_exists():
    stale = {name: sorted(where) for name, where in cited_names().items() if not resolves(name)}
    assert stale == {}


PATH = re.compile(
    r"(?<![\w./:-])((?:ringzero|bench|tests|docs|components|pipelines|helm|images|configs)/"
    r"[\w./-]*\w)"
)


def cited_paths() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in [*DOCS, *(p for p in SOURCES if p.is_relative_to(ROOT / "ringzero"))]:
        for cited in PATH.findall(path.read_text()):
            if (
                any(ch in cited for ch in "*<>{}")
                or cited.endswith((".", "-"))
                or re.search(r"/[A-Z_]+\b", cited)
            ):
                # a pattern or a placeholder (``bench/NAME.py``), not a path; ``COMMIT:path`` is history
                continue
            out.setdefault(cited, set()).add(str(path.relative_to(ROOT)))
    return out


def exists(cited: str) -> bool:
    """A file or folder, or a module path followed by a name in it (``ringzero/stages/rl.run``)."""
    target = ROOT / cited
    return (
        target.exists()
        or target.with_suffix(".py").exists()
        or (ROOT / cited.split(".")[0]).with_suffix(".py").exists()
    )


def test_every_repository_path_the_docs_cite_exists():
    generated = re.compile(r"^(tests/servers/\.|docs/.*\.(png|svg|html)$)")
    missing = {c: sorted(w) for c, w in cited_paths().items() if not exists(c) and not generated.match(c)}
    assert missing == {}


BARE_FILE = re.compile(r"(?<![\w./:-])([A-Za-z_][\w-]*\.py)\b")
PEER_FILES = {
    # files of the projects ringzero reads or patches, cited by their own names beside the project's
    "bailing_moe_linear.py": "SGLang's Ling 2.5 model",
    "detokenizer_manager.py": "SGLang",
    "io_struct.py": "SGLang",
    "routed_experts_capturer.py": "SGLang",
    "tokenizer_manager.py": "SGLang",
    "modeling_bailing_moe_v2_5.py": "the Ring-V2.5 reference model",
    "clip_grads.py": "Megatron-core",
    "distrib_optimizer.py": "Megatron-core",
    "p2p_communication.py": "Megatron-core",
    "schedules.py": "Megatron-core",
    "utils.py": "Megatron-core",
    "rollout_corr_helper.py": "verl",
    "NAME.py": "a placeholder",
}


def bare_file_names(paths) -> dict[str, set[str]]:
    """File names cited without a folder (``server_format.py``) in ``paths``, except the peers' own files."""
    out: dict[str, set[str]] = {}
    for path in paths:
        for name in BARE_FILE.findall(path.read_text()):
            if name not in PEER_FILES:
                out.setdefault(name, set()).add(path.name)
    return out


def test_the_bare_file_name_detector_sees_one_and_skips_paths_and_peers(tmp_path):
    doc = tmp_path / "a.md"
    doc.write_text("see server_format.py, ringzero/tasks/base.py, SGLang's io_struct.py, x.pyc, `app.py`")
    assert bare_file_names([doc]) == {"server_format.py": {"a.md"}, "app.py": {"a.md"}}


def test_every_bare_file_name_the_docs_cite_is_a_file_of_the_repository():
    """A bare name must still name a file here (a renamed module leaves its old name behind otherwise)."""
    here = {
        p.name
        for d in ("ringzero", "bench", "tests", "components", "pipelines")
        for p in (ROOT / d).rglob("*.py")
    }
    cited = bare_file_names([*DOCS, *(p for p in SOURCES if p.is_relative_to(ROOT / "ringzero"))])
    assert {name: sorted(w) for name, w in cited.items() if name not in here} == {}


BENCH = ROOT / "bench"


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def bench_modules() -> set[str]:
    return {p.stem for p in BENCH.glob("*.py")}


@pytest.mark.parametrize("path", sorted(BENCH.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_bench_edits_no_sys_path_and_imports_no_test_code(path):
    text = path.read_text()
    assert "sys.path" not in text, f"{path.relative_to(ROOT)} edits sys.path"
    imported = imported_modules(path)
    assert not {
        m for m in imported if m.split(".")[0] in ("tests", "conftest", "stage_kit", "layout_compare")
    }
    siblings = {m for m in imported if m in bench_modules()} - {"common"}
    assert not siblings, (
        f"{path.relative_to(ROOT)} imports bench scripts {sorted(siblings)}: share through common"
    )


@pytest.mark.parametrize(
    "path", sorted((ROOT / "tests").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_tests_import_nothing_from_bench(path):
    """Tests may run a bench script as a program (the GPU check's smoke mode); they never import one."""
    if path == Path(__file__).resolve():
        return  # this file names what it looks for
    assert not {m for m in imported_modules(path) if m.split(".")[0] in bench_modules() | {"bench"}}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if "bench" in line and ("sys.path" in line or "spec_from_file_location" in line):
            raise AssertionError(f"{path.relative_to(ROOT)}:{n} imports from bench/: {line.strip()}")

"""Which distributions an image's code paths import: modules imported for real in a fresh interpreter, and
the imports written inside their functions (lazy imports a run reaches later), mapped to the distributions
that provide them in this environment."""

from __future__ import annotations

import ast
import importlib.util
import os
import pkgutil
import subprocess
import sys
from functools import cache
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWN = ("ringzero", "pipelines", "components")

_IMPORT = """
import importlib, sys, warnings
warnings.simplefilter("ignore")
for name in sys.argv[1:]:
    importlib.import_module(name)
"""


def all_modules(package: str) -> list[str]:
    pkg = importlib.import_module(package) if package in sys.modules else __import__(package)
    out = [package]
    for info in pkgutil.walk_packages(pkg.__path__, prefix=f"{package}."):
        out.append(info.name)
    return out


def _source(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    return Path(spec.origin) if spec and spec.origin and spec.origin.endswith(".py") else None


def written_imports(module: str) -> set[str]:
    """Every module named by an import statement anywhere in ``module``'s source (functions included),
    plus ``ringzero.*`` module names given as strings (``importlib.import_module`` tables)."""
    path = _source(module)
    if path is None:
        return set()
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    optional = {
        id(n)
        for t in ast.walk(tree)
        if isinstance(t, ast.Try) and _catches_import_error(t)
        for stmt in t.body
        for n in ast.walk(stmt)
    }
    out = set()
    for node in ast.walk(tree):
        if id(node) in optional:  # `try: import x / except ImportError:` works without x
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith("ringzero.")
        ):
            if " " not in node.value and importlib.util.find_spec(
                node.value.rpartition(".")[0] or node.value
            ):
                out.add(node.value)
    return out


def _catches_import_error(node: ast.Try) -> bool:
    names = set()
    for handler in node.handlers:
        kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        names.update(k.id for k in kinds if isinstance(k, ast.Name))
    return bool(names & {"ImportError", "ModuleNotFoundError"})


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def closure(entries: list[str], excluded: dict[str, str]) -> set[str]:
    """Own modules reachable from ``entries`` through any import statement, never entering ``excluded``."""

    def out(name: str) -> bool:
        return any(name == e or name.startswith(e + ".") for e in excluded)

    seen: set[str] = set()
    todo = list(entries)
    while todo:
        name = todo.pop()
        if name in seen or out(name) or not _is_module(name):
            continue
        seen.add(name)
        # A parent package is imported too, and its module-level imports run (the interpreter that imports
        # the closure sees them); its functions' imports are reached only through what calls them.
        for imp in written_imports(name):
            if imp.split(".")[0] in OWN:
                todo.append(imp)
    return seen


def image_site(allowed: set[str], into: Path) -> Path:
    """A site folder holding only the installed distributions in ``allowed`` (canonical names), each of its
    top-level files and folders linked in: the image's site-packages as far as this machine can build it."""
    from importlib.metadata import distributions as installed

    from images_lock import canonical

    site = into / "site"
    site.mkdir()
    for dist in installed():
        if canonical(dist.metadata["Name"]) not in allowed:
            continue
        for top in {
            f.parts[0] for f in dist.files or () if f.parts and f.parts[0] not in ("..", "__pycache__")
        }:
            if top.endswith(".pth"):
                continue
            source = Path(dist.locate_file(top))
            if source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)
    return site


def import_in_image(modules: set[str], allowed: set[str], tmp: Path) -> subprocess.CompletedProcess:
    """Import ``modules`` in a fresh interpreter that sees the standard library, the project's source and
    only the distributions in ``allowed``, as in the image: an optional import (``try: import attr``) is
    skipped there as it would be in the image, and a required one fails with ModuleNotFoundError."""
    site = image_site(allowed, tmp)
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "HOME": str(tmp)}
    return subprocess.run(
        [sys.executable, "-S", "-c", _IMPORT, *sorted(modules)],
        capture_output=True,
        text=True,
        cwd=tmp,
        env=env,
        timeout=300,
    )


def written_third_party(modules: set[str]) -> set[str]:
    """Top-level names of non-own, non-stdlib modules named by required (unguarded) import statements."""
    tops = {i.split(".")[0] for m in modules for i in written_imports(m)}
    return {t for t in tops if t not in sys.stdlib_module_names and t not in OWN and not t.startswith("_")}


@cache
def _providers() -> dict[str, list[str]]:
    return packages_distributions()


@cache
def _owner_of_file() -> dict[Path, str]:
    """Installed file -> its distribution, for modules vendored inside another distribution (setuptools'
    ``_vendor`` folder puts ``jaraco`` and ``more_itertools`` on the path)."""
    from importlib.metadata import distributions as installed

    out = {}
    for dist in installed():
        for f in dist.files or ():
            if f.suffix == ".py":
                out[Path(dist.locate_file(f)).resolve()] = dist.metadata["Name"]
    return out


# Modules setuptools vendors and puts on the path itself (its `_vendor` folder) when pkg_resources loads.
SETUPTOOLS_VENDORED = {"backports", "jaraco", "more_itertools"}


def _provider(top: str) -> list[str]:
    if top in SETUPTOOLS_VENDORED:
        return ["setuptools"]
    if top in _providers():
        return _providers()[top]
    spec = importlib.util.find_spec(top)
    origin = spec and (
        spec.origin
        if spec.origin and spec.origin != "namespace"
        else next(iter(spec.submodule_search_locations or ()), None)
    )
    if origin:
        path = Path(origin).resolve()
        candidates = [path] if path.is_file() else sorted(path.rglob("*.py"))[:1]
        for c in candidates:
            if c in _owner_of_file():
                return [_owner_of_file()[c]]
    return [f"?{top}"]


def distributions(tops: set[str]) -> dict[str, set[str]]:
    """``{distribution (canonical name): top-level modules}``; a module no installed distribution provides
    maps to itself under ``?``."""
    from images_lock import canonical

    out: dict[str, set[str]] = {}
    for top in tops:
        for dist in _provider(top):
            out.setdefault(canonical(dist), set()).add(top)
    return out

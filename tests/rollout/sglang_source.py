"""SGLang's request structs read from its installed source, never imported (the server's dependencies are
not installed: `make setup` installs the wheel the rollout image is built on with ``--no-deps``)."""

from __future__ import annotations

import ast
import re
from functools import cache
from importlib import metadata
from pathlib import Path

from ci_require import require_tool

ROOT = Path(__file__).resolve().parents[2]
IO_STRUCT = "sglang/srt/managers/io_struct.py"
SAMPLING_PARAMS = "sglang/srt/sampling/sampling_params.py"


def image_version() -> str:
    """The SGLang version of the rollout image (``ARG BASE_IMAGE=lmsysorg/sglang:vX.Y.Z-...``)."""
    text = (ROOT / "images" / "rollout" / "Dockerfile").read_text()
    found = re.search(r"^ARG BASE_IMAGE=lmsysorg/sglang:v([0-9.]+)", text, re.M)
    assert found, "images/rollout/Dockerfile: no ARG BASE_IMAGE=lmsysorg/sglang:v<version>"
    return found.group(1)


def distribution() -> metadata.Distribution:
    try:
        return metadata.distribution("sglang")
    except metadata.PackageNotFoundError:
        require_tool(
            "sglang", f"SGLang's source (make setup installs sglang=={image_version()} with --no-deps)"
        )


@cache
def struct_fields(relative: str) -> dict[str, list[str]]:
    """``{class name: annotated field names}`` of a module, each class with the fields of its bases in the
    same module first (``UpdateWeightFromDiskReqInput`` carries ``BaseReq``'s ``rid``)."""
    path = Path(distribution().locate_file(relative))
    tree = ast.parse(path.read_text(), filename=str(path))
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

    def fields(name: str) -> list[str]:
        node = classes[name]
        inherited = [
            f for b in node.bases if isinstance(b, ast.Name) and b.id in classes for f in fields(b.id)
        ]
        own = [
            s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
        ]
        return inherited + [f for f in own if f not in inherited]

    return {name: fields(name) for name in classes}


@cache
def server_flags() -> set[str]:
    """The command-line flags of ``sglang.launch_server``: one ``--x-y`` per ServerArgs field ``x_y``
    (its ``arg_groups/field_order.py`` lists the built-in fields, ``_field_to_cli_name`` spells them)."""
    path = Path(distribution().locate_file("sglang/srt/arg_groups/field_order.py"))
    tree = ast.parse(path.read_text(), filename=str(path))
    (order,) = [
        n.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "POSITIONAL_FIELD_ORDER" for t in n.targets)
    ]
    return {"--" + ast.literal_eval(e).replace("_", "-") for e in order.elts}

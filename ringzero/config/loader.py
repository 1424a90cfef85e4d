"""Load a run: YAML file -> ``--set`` overrides -> typed ``RunConfig``, with every problem reported at
once."""

from __future__ import annotations

import difflib
import hashlib
import json
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from ringzero.config.run import RunConfig, stage_graph_problems
from ringzero.config.targets import target_problems
from ringzero.errors import ConfigError


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys instead of silently keeping the last one."""


def _mapping_no_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_no_duplicates)


def read_yaml(text: str, source: str) -> dict:
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, [f"YAML syntax at {where}: {problem}"]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, [f"top level must be a mapping of sections, got {type(data).__name__}"])
    return data


def apply_overrides(data: dict, overrides: list[str], source: str = "--set") -> dict:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML). List items are addressed by index or by
    name."""
    problems = []
    for item in overrides:
        if "=" not in item:
            problems.append(f"{item!r}: expected PATH=VALUE, e.g. stages.stage1.steps=10")
            continue
        path, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        keys = [k for k in path.strip().split(".") if k]
        if not keys:
            problems.append(f"{item!r}: empty path")
            continue
        try:
            _set_path(data, keys, value)
        except (KeyError, IndexError, TypeError) as exc:
            problems.append(f"{path}: {exc.args[0] if exc.args else exc}")
    if problems:
        raise ConfigError(source, problems)
    return data


def _set_path(node: Any, keys: list[str], value: Any) -> None:
    walked = []
    for i, key in enumerate(keys):
        last = i == len(keys) - 1
        if isinstance(node, list):
            idx = _list_index(node, key, walked)
            if last:
                node[idx] = value
                return
            node = node[idx]
        elif isinstance(node, dict):
            if last:
                node[key] = value
                return
            if key not in node or node[key] is None:
                node[key] = {}
            node = node[key]
        else:
            raise TypeError(
                f"cannot descend into {'.'.join(walked) or 'the top level'}: it is a {type(node).__name__}"
            )
        walked.append(key)


def _list_index(items: list, key: str, walked: list[str]) -> int:
    where = ".".join(walked)
    if key.lstrip("-").isdigit():
        idx = int(key)
        if not -len(items) <= idx < len(items):
            raise IndexError(f"{where} has {len(items)} items; index {idx} is out of range")
        return idx
    for idx, item in enumerate(items):
        if isinstance(item, dict) and item.get("name") == key:
            return idx
    names = [it.get("name") for it in items if isinstance(it, dict)]
    raise KeyError(f"{where} has no item named {key!r} (names: {names})")


def parse_config(data: dict, source: str = "<config>") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            text = _describe(err, data)
            # Model-level checks join several field-named problems with "; ".
            problems += text.split("; ") if not err["loc"] else [text]
        stages = data.get("stages")
        if isinstance(stages, list):
            # Cross-stage checks run only once fields are valid; report them now too, once each.
            problems += [p for p in stage_graph_problems(stages) if not any(p in q for q in problems)]
        targets = data.get("targets")
        if isinstance(targets, list):
            names = [s.get("name") for s in stages if isinstance(s, dict)] if isinstance(stages, list) else []
            problems += [
                p
                for p in target_problems(targets, [n for n in names if isinstance(n, str)])
                if p not in problems
            ]
        raise ConfigError(source, problems) from None


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), ["no such file"])
    data = read_yaml(path.read_text(), str(path))
    apply_overrides(data, list(overrides or []))
    return parse_config(data, str(path))


def config_hash(model: BaseModel | dict) -> str:
    """sha256 over canonical JSON: the identity of a config (or a section of one)."""
    payload = model.model_dump(mode="json") if isinstance(model, BaseModel) else model
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# --- error formatting ----------------------------------------------------------------------------


def _describe(err: dict, data: dict) -> str:
    loc = _strip_union_tags(err["loc"], data)
    path = _format_loc(loc) or "<top level>"
    msg = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if err["type"] == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1], data)
        hint = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        msg = "unknown key" + (f"; did you mean {hint[0]!r}?" if hint else f"; allowed: {', '.join(allowed)}")
        return f"{path}: {msg}"
    if err["type"] == "missing":
        return f"{path}: required field is missing"
    if not loc:
        return msg  # model-level checks already name their fields
    if isinstance(err.get("input"), dict):
        # A section-level check: it names the field it is about first ("stage_pod: ..."), if any.
        head, sep, rest = msg.partition(": ")
        if sep and head in _allowed_keys(loc, data):
            return f"{path}.{head}: {rest}"
        return f"{path}: {msg}"
    if "got" in msg:
        return f"{path}: {msg}"
    return f"{path}: {msg} (got {_short(err.get('input'))})"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _format_loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _strip_union_tags(loc: tuple, data: Any) -> tuple:
    """Drop the discriminator tags pydantic puts in locations (``stages.1.rl.lr`` -> ``stages[1].lr``)."""
    out = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part not in node and node.get("kind") == part:
            continue
        out.append(part)
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            node = None
    return tuple(out)


def _allowed_keys(loc: tuple, data: Any) -> list[str]:
    cls: Any = RunConfig
    node = data
    for part in loc:
        cls = _pick_model(cls, node)
        if isinstance(cls, type) and issubclass(cls, BaseModel) and isinstance(part, str):
            field = cls.model_fields.get(part)
            if field is None:
                return []
            cls = field.annotation
        elif typing.get_origin(cls) is list and isinstance(part, int):
            cls = typing.get_args(cls)[0]
        else:
            return []
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            node = None
    cls = _pick_model(cls, node)
    return sorted(cls.model_fields) if isinstance(cls, type) and issubclass(cls, BaseModel) else []


def _pick_model(tp: Any, node: Any) -> Any:
    """Unwrap Annotated/Optional/Union to the model class that ``node`` validates against."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
            continue
        if origin in (typing.Union, types.UnionType):
            models = [a for a in typing.get_args(tp) if isinstance(a, type) and issubclass(a, BaseModel)]
            kind = node.get("kind") if isinstance(node, dict) else None
            for m in models:
                default = m.model_fields.get("kind")
                if default is not None and default.default == kind:
                    return m
            return models[0] if len(models) == 1 else tp
        return tp

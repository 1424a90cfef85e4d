"""Imports in ringzero/ point one way: down the floors docs/ARCHITECTURE.md lists in its ```layers block.

Each line of that block is a floor, ground floor first; its words are rooms (a top-level module, or a
package folder such as ``rollout/engine``). A module belongs to the deepest room that contains it. Rooms on
one floor share it and do not import each other; a room imports only the floors below it. Every ``import`` and
``from ... import`` counts, at module level, inside functions and under ``TYPE_CHECKING`` alike: an arrow
that only works because it is lazy is an arrow all the same."""

from __future__ import annotations

import pytest
from test_import_graph import PACKAGE, import_graph

ARCHITECTURE = PACKAGE.parent / "docs" / "ARCHITECTURE.md"


def floors(text: str) -> list[list[str]]:
    head = "```layers\n"
    if head not in text:
        raise AssertionError("docs/ARCHITECTURE.md has no ```layers block")
    block = text.split(head, 1)[1].split("```", 1)[0]
    return [line.split() for line in block.splitlines() if line.strip()]


def room_of(module: str, rooms: list[str]) -> str | None:
    """The deepest room holding ``module`` (``ringzero.rollout.engine.gap`` -> ``rollout/engine``)."""
    parts = module.split(".")[1:] or ["__init__"]
    best = None
    for room in rooms:
        steps = room.split("/")
        if parts[: len(steps)] == steps and (best is None or len(steps) > len(best.split("/"))):
            best = room
    return best


def upward_edges(graph: dict[str, set[str]], levels: list[list[str]]) -> list[str]:
    floor = {room: i for i, rooms in enumerate(levels) for room in rooms}
    rooms = list(floor)
    bad = []
    for src, targets in sorted(graph.items()):
        a = room_of(src, rooms)
        for dst in sorted(targets):
            b = room_of(dst, rooms)
            if a is None or b is None:
                bad.append(f"{src if a is None else dst}: in no room of the layers block")
            elif a != b and floor[b] >= floor[a]:
                bad.append(f"{src} ({a}, floor {floor[a]}) imports {dst} ({b}, floor {floor[b]})")
    return sorted(set(bad))


def test_the_detector_sees_an_arrow_up_and_a_module_in_no_room():
    levels = [["errors"], ["model"], ["rollout"], ["rollout/clients", "rollout/replicas"], ["rollout/engine"]]
    graph = {
        "ringzero.model.hybrid": {"ringzero.errors", "ringzero.rollout.engine.gap"},
        "ringzero.rollout.replicas.replica_set": {
            "ringzero.rollout.clients.http_client",
            "ringzero.rollout.types",
        },
        "ringzero.rollout.engine.gap": {"ringzero.rollout.types", "ringzero.model.hybrid"},
        "ringzero.cli.main": {"ringzero.errors"},
    }
    assert upward_edges(graph, levels) == [
        "ringzero.cli.main: in no room of the layers block",
        "ringzero.model.hybrid (model, floor 1) imports ringzero.rollout.engine.gap (rollout/engine, floor "
        "4)",
        "ringzero.rollout.replicas.replica_set (rollout/replicas, floor 3) imports "
        "ringzero.rollout.clients.http_client (rollout/clients, floor 3)",
    ]
    assert room_of("ringzero", ["__init__"]) == "__init__"


def test_every_room_in_the_block_exists_once():
    levels = floors(ARCHITECTURE.read_text())
    rooms = [room for level in levels for room in level]
    assert len(rooms) == len(set(rooms))
    for room in rooms:
        path = PACKAGE / room
        assert path.is_dir() or path.with_suffix(".py").is_file(), (
            f"layers block names {room}: no such module"
        )


def test_ringzero_imports_point_down_the_floors_of_the_architecture_page():
    assert upward_edges(import_graph(), floors(ARCHITECTURE.read_text())) == []


@pytest.mark.parametrize(
    "package", sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
)
def test_every_package_is_placed(package):
    rooms = [room for level in floors(ARCHITECTURE.read_text()) for room in level]
    assert room_of(f"ringzero.{package}.x", rooms) is not None, f"ringzero/{package} is on no floor"


def test_the_block_is_read_from_the_page_itself(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("intro\n```layers\nerrors logs\nmodel\n```\nrest\n")
    assert floors(page.read_text()) == [["errors", "logs"], ["model"]]

"""Gloo rank pools shared by the CP tests.

Spawning ranks costs seconds (each imports torch), so each pytest worker keeps one pool per world size
for the whole session. Tests that use the same pool carry the same ``xdist_group`` mark, so
``pytest -n 2 --dist loadgroup`` runs them on one worker and each pool is spawned once. A job that
fails tears its pool down (its ranks may be stuck in a collective); the next test gets a fresh one.
"""

from __future__ import annotations

import pytest

from ringzero.parallel.launch import RankPool


class SharedPool:
    def __init__(self, world_size: int):
        self.world_size = world_size
        self._pool: RankPool | None = None

    def run(self, fn, *args, **kwargs) -> list:
        if self._pool is None or not self._pool.alive:
            self._pool = RankPool(self.world_size, timeout_s=120)
        return self._pool.run(fn, *args, **kwargs)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()


@pytest.fixture(scope="session")
def pools():
    made: dict[int, SharedPool] = {}

    def get(world_size: int) -> SharedPool:
        if world_size not in made:
            made[world_size] = SharedPool(world_size)
        return made[world_size]

    yield get
    for pool in made.values():
        pool.close()

"""Parametrisations shared by the CP tests: one ``xdist_group`` per pool size, so each pytest worker
spawns each pool once under ``--dist loadgroup``."""

import pytest


def cp_param(n: int):
    return pytest.param(n, marks=pytest.mark.xdist_group(f"cp{n}"), id=f"cp{n}")


CP_SIZES = [cp_param(2), cp_param(4)]

"""The suite's Hypothesis profile (tests/conftest.py): no per-example deadline, on a developer's machine as
on CI. Hypothesis's own default is 200 ms, which two shared cores turn into flakes."""

from hypothesis import settings


def test_the_loaded_profile_has_no_deadline():
    assert settings().deadline is None

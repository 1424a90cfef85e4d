"""Shared pydantic base for every typed config: unknown keys are errors, values are never rewritten."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A config section. Unknown keys are rejected; instances are immutable once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


_SLUG = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def _slug(max_len: int):
    def check(v: str) -> str:
        if not _SLUG.match(v) or len(v) > max_len:
            raise ValueError(
                f"must be 1-{max_len} characters of lowercase letters, digits and '-', "
                f"starting with a letter or digit (got {v!r})"
            )
        return v

    return AfterValidator(check)


Slug = Annotated[str, _slug(39)]
"""A name usable in URIs, Kubernetes labels and file names (stage, tier)."""

RunName = Annotated[str, _slug(63)]

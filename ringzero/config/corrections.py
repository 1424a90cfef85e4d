"""Typed settings of each train/rollout mismatch correction; ``LossSettings.corrections`` is a list of them,
a discriminated union on ``kind``. Pydantic only: importing it never imports torch."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from ringzero.strict_model import StrictModel


class TISCorrection(StrictModel):
    """Token-level truncated IS: each token's weight is min(r_t, cap)."""

    kind: Literal["tis"] = "tis"
    cap: float = Field(2.0, gt=1, description="upper truncation of the per-token weight")


class SeqISCorrection(StrictModel):
    """Sequence-level IS: every token of a sequence takes min(prod_t r_t, cap), or min(exp(mean_t log r_t),
    cap)."""

    kind: Literal["seq_is"] = "seq_is"
    cap: float = Field(2.0, gt=1, description="upper truncation of the sequence weight")
    form: Literal["product", "geometric"] = Field(
        "product", description="product of ratios or their geometric mean"
    )


class _Bounds(StrictModel):
    lower: float = Field(0.5, gt=0, lt=1, description="drop below this ratio")
    upper: float = Field(2.0, gt=1, description="drop above this ratio")


class MaskedISCorrection(_Bounds):
    """Masked IS (rejection): drop tokens, or whole sequences, whose ratio is outside [lower, upper]."""

    kind: Literal["masked_is"] = "masked_is"
    level: Literal["token", "sequence"] = "token"
    form: Literal["product", "geometric"] | None = Field(
        None,
        description="sequence level only: the sequence ratio is the product (default) or the geometric mean",
    )

    @model_validator(mode="after")
    def _form_is_for_sequences(self) -> MaskedISCorrection:
        if self.level == "token" and self.form is not None:
            raise ValueError("masked_is: form applies to level: sequence only (a token has one ratio)")
        return self


class IcePopCorrection(_Bounds):
    """IcePop: tokens with r_t outside [lower, upper] are dropped, the kept ones weighted by r_t."""

    kind: Literal["icepop"] = "icepop"
    lower: float = Field(0.5, gt=0, lt=1, description="drop below this ratio")
    upper: float = Field(5.0, gt=1, description="drop above this ratio")


class VetoCorrection(StrictModel):
    """Veto: drop a whole sequence when any of its token ratios is below ``floor``."""

    kind: Literal["veto"] = "veto"
    floor: float = Field(1e-4, gt=0, lt=1, description="a token ratio below it vetoes its sequence")


Correction = Annotated[
    TISCorrection | SeqISCorrection | MaskedISCorrection | IcePopCorrection | VetoCorrection,
    Field(discriminator="kind"),
]

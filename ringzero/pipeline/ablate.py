"""Controlled comparisons: the same run, from the same pretrained base, varied in one setting (an *arm*) and
repeated over seeds.

Each (arm, seed) is a run of its own: the config's stages up to the study's last one, gates off, every stage
after the base seeded with the seed (``StageBase.seed``, so the base is pretrained once and shared), then
an eval stage that measures the study's checkpoints on the held-out prompts. Stages are cached by
identity like any run's, so an arm that matches a committed stage (seed 0 of the shipped setting is
``make run``'s) costs nothing, and arms of different studies share what they have in common.

A study (ringzero.pipeline.studies) reads each run into numbers and says whether its claim held on every
seed, on none, or on some (inconclusive); ``run_study`` prints the table and writes
``<out>/<study>/ablation.json`` and ``report.html``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import structlog

from ringzero.config.loader import apply_overrides, parse_config, read_yaml
from ringzero.errors import RingzeroError
from ringzero.pipeline.ablate_report import table_rows, write_study_report
from ringzero.pipeline.local import run_pipeline

log = structlog.get_logger(__name__)

EVAL_STAGE = "eval"
ROLES = ("base", "stage1", "distill", "stage2", "tier")


def stage_roles(data: dict) -> dict[str, str]:
    """The stages a study speaks of, by role, named as the config names them: ``base`` the first pretrain
    stage, ``stage1`` the first RL stage, ``distill`` the first distill stage, ``stage2`` the first RL stage
    after it, ``tier`` the first RL stage with two tiers or more. A role the config lacks is absent."""
    stages = data.get("stages") or []
    roles: dict[str, str] = {}

    def first(role: str, start: int, holds) -> None:
        found = next((i for i, s in enumerate(stages) if i >= start and holds(s)), None)
        if found is not None:
            roles[role] = stages[found]["name"]

    first("base", 0, lambda s: s.get("kind") == "pretrain")
    first("stage1", 0, lambda s: s.get("kind") == "rl")
    first("distill", 0, lambda s: s.get("kind") == "distill")
    if "distill" in roles:
        first("stage2", [s["name"] for s in stages].index(roles["distill"]), lambda s: s.get("kind") == "rl")
    first("tier", 0, lambda s: s.get("kind") == "rl" and len(s.get("tiers") or []) >= 2)
    return roles


def cast(study, data: dict):
    """The study with its roles replaced by the config's stage names: in ``through``, ``measure`` (each a role
    or a stage name) and every override (``{stage1}`` in ``stages.{stage1}.steps=25``); and, per stage name,
    the label the study reads it under (its role or its own name). Refuses a study whose roles the config
    lacks."""
    roles, names = stage_roles(data), [s.get("name") for s in data.get("stages") or []]
    labels = (study.through, *study.measure)
    placeholders = {
        r for sets in (study.common, *study.arms.values()) for o in sets for r in ROLES if f"{{{r}}}" in o
    }
    missing = sorted({x for x in labels if x not in roles and x not in names} | (placeholders - set(roles)))
    if missing:
        raise RingzeroError(
            f"ablate: study {study.name!r} needs stage role(s) {missing}; the config's roles are {roles}"
        )

    def fill(sets: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for o in sets:
            for role, name in roles.items():
                o = o.replace(f"{{{role}}}", name)
            out.append(o)
        return tuple(out)

    cast_study = replace(
        study,
        through=roles.get(study.through, study.through),
        measure=tuple(roles.get(m, m) for m in study.measure),
        common=fill(study.common),
        arms={arm: fill(sets) for arm, sets in study.arms.items()},
    )
    return cast_study, {roles.get(x, x): x for x in labels}


@dataclass
class ArmRun:
    """What one (arm, seed) run left: each stage's metric records and summary, and the eval's rows."""

    arm: str
    seed: int
    records: dict[str, list[dict]]
    summaries: dict[str, dict]
    wall_s: dict[str, float]
    rows: dict[str, dict] = field(default_factory=dict)
    """Eval values per measured stage name."""


def study_data(data: dict, through: str, measure: list[str], seed: int) -> dict:
    """The run file cut to the study: stages up to ``through`` with their gates off and every stage after a
    pretrain seeded, then one eval of ``measure`` (the config's own eval settings, when it has an eval)."""
    stages = data.get("stages") or []
    names = [s.get("name") for s in stages]
    if through not in names:
        raise RingzeroError(f"ablate: the config has no stage {through!r} (stages: {names})")
    if missing := [m for m in measure if m not in names[: names.index(through) + 1]]:
        raise RingzeroError(f"ablate: measured stage(s) {missing} are not at or before {through!r}")
    kept = [dict(s) for s in stages[: names.index(through) + 1]]
    for s in kept:
        s["gate"] = []
        if s.get("kind") != "pretrain":
            s["seed"] = seed
    evals = [dict(s) for s in stages if s.get("kind") == "eval"]
    ev = evals[-1] if evals else {"kind": "eval"}
    ev.update(name=EVAL_STAGE, init=through, compare=list(measure), gate=[], seed=seed)
    return {**data, "stages": [*kept, ev], "targets": []}


def load_arm(config: str | Path, overrides: list[str], through: str, measure: list[str], seed: int):
    path = Path(config)
    if not path.is_file():
        raise RingzeroError(f"ablate: no such config file {path}")
    data = apply_overrides(read_yaml(path.read_text(), str(path)), list(overrides))
    return parse_config(study_data(data, through, measure, seed), f"{path} (ablation arm)")


def run_arm(
    cfg, store, run_dir: Path, arm: str, seed: int, runtime=None, role_of: dict[str, str] | None = None
) -> ArmRun:
    """The arm's run, its stages keyed by their role (``role_of``: stage name -> role) where they have one."""
    role = (role_of or {}).get
    result = run_pipeline(cfg, store, run_dir, runtime=runtime)
    if result.status != "succeeded":
        raise RingzeroError(f"ablate: arm {arm!r} seed {seed} ended {result.status}")
    ev = next(ex for ex in result.stages if ex.name == EVAL_STAGE)
    return ArmRun(
        arm=arm,
        seed=seed,
        records={role(ex.name, ex.name): ex.metrics for ex in result.stages},
        summaries={role(ex.name, ex.name): ex.outcome.summary for ex in result.stages},
        wall_s={role(ex.name, ex.name): (0.0 if ex.skipped else ex.outcome.wall_s) for ex in result.stages},
        rows={
            role(r["checkpoint"], r["checkpoint"]): r["values"]
            for r in ev.outcome.extra["comparison"]["rows"]
        },
    )


def curves(study, run: ArmRun) -> dict[str, list]:
    """``curve/<key>``: the ``through`` stage's per-step values of each of the study's curve metrics."""
    records = sorted(run.records.get(study.through, []), key=lambda r: r.get("step", 0))
    return {f"curve/{key}": [[r["step"], r[key]] for r in records if key in r] for key in study.curves}


def verdict_over_seeds(holds: list[bool]) -> str:
    """A claim measured per seed holds when it holds on every seed, does not when on none."""
    if holds and all(holds):
        return "held"
    if not any(holds):
        return "did not hold"
    return "inconclusive"


def run_study(study, config: str | Path, overrides: list[str], seeds: list[int], out: Path) -> dict:
    """Every arm on every seed, then the study's table, verdicts and report. Returns what it writes."""
    from ringzero.parallel.runtime import single
    from ringzero.store import open_store

    if len(seeds) < 2:
        log.warning("ablate.one_seed", note="one seed gives no run-to-run spread: verdicts need two")
    path = Path(config)
    if not path.is_file():
        raise RingzeroError(f"ablate: no such config file {path}")
    cast_study, role_of = cast(
        study, apply_overrides(read_yaml(path.read_text(), str(path)), list(overrides))
    )
    runs: list[ArmRun] = []
    failed: list[dict] = []
    for arm, arm_sets in cast_study.arms.items():
        for seed in seeds:
            sets = [*overrides, *cast_study.common, *arm_sets]
            cfg = load_arm(config, sets, cast_study.through, list(cast_study.measure), seed)
            run_dir = out / study.name / arm / f"seed{seed}"
            log.info("ablate.arm", study=study.name, arm=arm, seed=seed, run_dir=str(run_dir))
            store = open_store(cfg.storage.root, cfg.storage.s3)
            try:
                runs.append(run_arm(cfg, store, run_dir, arm, seed, runtime=single(), role_of=role_of))
            except RingzeroError as exc:  # e.g. a rollback arm spending its budget: a result, not a crash
                log.warning("ablate.arm_failed", study=study.name, arm=arm, seed=seed, error=str(exc)[:300])
                failed.append({"arm": arm, "seed": seed, "error": str(exc)})
    readouts = {(r.arm, r.seed): {**study.readout(r), **curves(study, r)} for r in runs}
    verdicts = study.verdicts(readouts, seeds)
    result = {
        "study": study.name,
        "claim": study.claim,
        "config": str(config),
        "overrides": list(overrides),
        "seeds": list(seeds),
        "arms": {arm: list(sets) for arm, sets in cast_study.arms.items()},
        "common": list(cast_study.common),
        "readouts": [{"arm": a, "seed": s, **v} for (a, s), v in readouts.items()],
        "verdicts": verdicts,
        "failed": failed,
        "wall_s": {f"{r.arm}/seed{r.seed}": r.wall_s for r in runs},
    }
    (out / study.name).mkdir(parents=True, exist_ok=True)
    path = out / study.name / "ablation.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=float))
    tmp.replace(path)
    write_study_report(study, result, out / study.name / "report.html")
    return result


def print_study(study, result: dict) -> None:
    headers, rows = table_rows(study, result)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print(f"\n{study.name}: {study.claim}")
    print(f"seeds {result['seeds']} (mean ± half-range over seeds)")
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    for v in result["verdicts"]:
        print(f"- {v['claim']}: {v['verdict'].upper()} ({v['detail']})")
    for f in result.get("failed", []):
        print(f"- arm {f['arm']} seed {f['seed']} failed: {f['error']}")

"""What every training stage builds first: threads, task, tokenizer, and the model it starts from."""

from __future__ import annotations

import torch

from ringzero.errors import RingzeroError
from ringzero.model.config import PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.model.vector_math import set_threads
from ringzero.parallel.parallelize import parallelize
from ringzero.parallel.runtime import Runtime
from ringzero.rl.seeds import derive_seed as seeded
from ringzero.tasks import make_task
from ringzero.tasks.base import Task
from ringzero.tokenizer import build_tokenizer
from ringzero.tokenizer.base import Tokenizer


def apply_threads(cfg) -> None:
    if cfg.run.threads:
        set_threads(cfg.run.threads)


def task_and_tokenizer(cfg) -> tuple[Task, Tokenizer]:
    tokenizer = build_tokenizer(cfg.tokenizer)
    if tokenizer.vocab_size > cfg.model.vocab_size:
        raise RingzeroError(
            f"model.vocab_size: {cfg.model.vocab_size} is smaller than the tokenizer's "
            f"{tokenizer.vocab_size} ids"
        )
    return make_task(cfg.task), tokenizer


def fresh_model(cfg, policy: PrecisionPolicy, salt: str = "init") -> HybridLM:
    """A newly initialised model; the weights depend on the run seed only (and ``salt``)."""
    model = HybridLM(cfg.model, policy)
    generator = torch.Generator().manual_seed(seeded(cfg.run.seed, salt))
    model.reset_parameters(generator)
    return model


def placed(model: HybridLM, cfg, runtime: Runtime) -> HybridLM:
    """``model`` on the stage's device, its attention cores swapped for the CP strategies of
    ``cfg.parallel`` when the job shards sequences (the model code itself stays single-device)."""
    model = model.to(runtime.device)
    if runtime.dims.cp > 1:
        parallelize(model, runtime.groups, cfg.parallel.cp_plan, cfg.parallel.sharding)
    return model


def training_model(cfg, store, init_uri: str | None, policy: PrecisionPolicy, runtime: Runtime) -> HybridLM:
    """``start_model`` placed for training on this job's device and layout."""
    return placed(start_model(cfg, store, init_uri, policy), cfg, runtime)


def start_model(cfg, store, init_uri: str | None, policy: PrecisionPolicy) -> HybridLM:
    """The stage's input checkpoint under ``policy``, or a fresh model when it has none."""
    if init_uri is None:
        return fresh_model(cfg, policy)
    from ringzero.model.checkpoint import load_model

    loaded = load_model(init_uri, policy, store=store if _under(store, init_uri) else None)
    if loaded.config != cfg.model:
        raise RingzeroError(f"{init_uri}: its model config differs from this run's model section")
    return loaded.model


def _under(store, uri: str) -> bool:
    try:
        store.name_of(uri)
        return True
    except RingzeroError:
        return False

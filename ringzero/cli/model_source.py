"""Where a command's weights come from: a committed checkpoint, or random init of a config's model.

Shared by every command that takes ``--checkpoint URI | --model-path DIR | --init random [--config FILE]``
(``check gap``, ``serve``, ``export``), so all accept and refuse the same combinations with the same
messages. ``--model-path`` is a local Ling 2.5 folder, as ``sglang.launch_server --model-path`` takes.
"""

from __future__ import annotations

import argparse

from ringzero.errors import RingzeroError


def add_model_source_args(p: argparse.ArgumentParser, config_help: str) -> None:
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--checkpoint", metavar="URI", help="committed model checkpoint (file://... or s3://...)"
    )
    source.add_argument(
        "--model-path", metavar="DIR", help="local Ling 2.5 model folder (what `ringzero export` writes)"
    )
    source.add_argument("--init", choices=["random"], help="random weights of --config's model section")
    p.add_argument("--config", metavar="FILE", help=config_help)


def load_source_model(args: argparse.Namespace, policy, model_cfg=None, s3=None):
    """``(model, label)`` under ``policy``; random init is seeded by ``args.seed``.

    ``model_cfg`` is the model section ``--config`` supplied (None: the default tiny model).
    """
    import torch

    from ringzero.model.config import ModelConfig
    from ringzero.model.hybrid import HybridLM

    if args.checkpoint:
        from ringzero.model.checkpoint import load_model

        return load_model(args.checkpoint, policy, s3=s3).model, args.checkpoint
    if getattr(args, "model_path", None):
        from ringzero.model.hf_folder import load_folder

        return load_folder(args.model_path, policy).model, args.model_path
    model = HybridLM(model_cfg or ModelConfig(), policy)
    model.reset_parameters(torch.Generator().manual_seed(args.seed))
    return model, f"random://seed-{args.seed}"


def refuse_config_with_checkpoint(args: argparse.Namespace) -> None:
    if (args.checkpoint or getattr(args, "model_path", None)) and args.config:
        raise RingzeroError("--config goes with --init random; a checkpoint carries its own model config")

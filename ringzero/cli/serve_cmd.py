"""``ringzero serve``: the embedded rollout engine behind SGLang's HTTP API.

    ringzero serve --checkpoint file://runs/store/base --port 30000
    ringzero serve --model-path DIR                                 # a Ling 2.5 folder, as SGLang takes
    ringzero serve --init random --config configs/tiny-cpu.yaml     # smoke tests, no checkpoint

``--config`` takes a run config or a bare model section. From a run config come the tokenizer, the
rollout precision, ``deterministic`` and the S3 settings for ``s3://`` checkpoints; the model section
is used only by ``--init random`` (a checkpoint carries its own). Explicit flags win over it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ringzero.cli.model_source import add_model_source_args, load_source_model


def register(sub) -> None:
    from ringzero.model.config import PRESETS  # no torch behind it

    p = sub.add_parser(
        "serve",
        help="serve the embedded rollout engine over SGLang's native HTTP API",
        description="Serves /generate, /update_weights_from_disk, /health, /get_model_info, /flush_cache "
        "and the OpenAI-compatible /v1/completions, with SGLang's field names, so the HTTP rollout "
        "client drives this server and a real SGLang server alike.",
    )
    add_model_source_args(p, "run config or bare model section (needed with --init)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000, help="SGLang's default port")
    p.add_argument(
        "--precision",
        default=None,
        choices=sorted(PRESETS),
        help="rollout precision preset (default: the config's precision.rollout, else fp32-islands)",
    )
    p.add_argument(
        "--deterministic",
        action="store_true",
        default=None,
        help="batch-invariant log-probs, bitwise equal to the trainer's scoring",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        metavar="char|FILE",
        help="'char' or a tokenizer.json (default: the config's tokenizer, else char)",
    )
    p.add_argument("--weight-version", default="0", help="reported until the first weight update")
    p.add_argument(
        "--seed", type=int, default=0, help="random init and the stream that seeds unseeded requests"
    )
    p.add_argument("--max-batch", type=int, default=64, help="rows the engine decodes together")
    p.add_argument(
        "--batching",
        default="continuous",
        choices=("continuous", "static"),
        help="continuous: requests join the running batch between decoding steps; static: a batch "
        "decodes until its longest row ends while newcomers wait",
    )
    p.add_argument(
        "--batch-window-ms",
        type=float,
        default=5.0,
        help="how long the scheduler waits for more requests once one arrives",
    )
    from ringzero.rollout.server.schema import ServerLimits  # no torch behind it

    limits = ServerLimits()
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=limits.max_body_bytes,
        help="larger request bodies are refused with HTTP 413 before they are read (default 64 MiB)",
    )
    p.add_argument(
        "--max-request-sequences",
        type=int,
        default=limits.max_request_sequences,
        help="prompts x n one request may ask for; more is an HTTP 400",
    )
    p.add_argument(
        "--max-request-tokens",
        type=int,
        default=limits.max_request_tokens,
        help="prompt tokens plus max_new_tokens over a request's sequences; more is an HTTP 400",
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=limits.max_new_tokens,
        help="the largest max_new_tokens (max_tokens) a request may ask for; more is an HTTP 400",
    )
    p.set_defaults(handler=_serve)


@dataclass
class _FromConfig:
    """What ``--config`` contributes; every field None when there is no config or it is a bare model
    section."""

    model: object = None
    tokenizer: object = None
    precision: object = None
    deterministic: bool | None = None
    s3: object = None


def _from_config(path: str | None) -> _FromConfig:
    if path is None:
        return _FromConfig()
    from pathlib import Path

    from ringzero.cli.check_cmd import model_config_from_file
    from ringzero.config.loader import load_config, read_yaml

    if Path(path).is_file() and "run" in read_yaml(Path(path).read_text(), path):
        cfg = load_config(path)
        return _FromConfig(
            cfg.model, cfg.tokenizer, cfg.precision.rollout, cfg.precision.deterministic, cfg.storage.s3
        )
    return _FromConfig(model=model_config_from_file(path))


def _tokenizer(flag: str | None, section):
    from ringzero.tokenizer import CharTokenizer, HFJsonTokenizer, build_tokenizer

    if flag is None:
        return (
            (build_tokenizer(section), getattr(section, "path", "char"))
            if section
            else (CharTokenizer(), "char")
        )
    return (CharTokenizer(), "char") if flag == "char" else (HFJsonTokenizer(flag), flag)


def _serve(args: argparse.Namespace) -> int:
    from ringzero.errors import RingzeroError

    if args.init == "random" and args.config is None:  # before torch loads: fail fast
        raise RingzeroError("serve --init random needs --config with a model section")
    import structlog

    from ringzero.rollout.server.app import serve

    server = build_server(args)
    engine = server.scheduler.engine
    structlog.get_logger("ringzero.serve").info(
        "serve.start",
        url=f"http://{args.host}:{args.port}",
        model_path=server.model_path,
        precision=engine.policy.name(),
        deterministic=engine.deterministic,
    )
    serve(server, args.host, args.port, log_level=args.log_level)
    return 0


def build_server(args: argparse.Namespace):
    """The ``RolloutServer`` ``ringzero serve`` runs for these arguments: the weights, tokenizer, engine and
    limits they name (the tokenizer of a ``--model-path`` folder is its own ``tokenizer.json``)."""
    from pathlib import Path

    from ringzero.errors import RingzeroError
    from ringzero.rollout.server.schema import ServerLimits

    limits = ServerLimits(
        max_body_bytes=args.max_body_bytes,
        max_request_sequences=args.max_request_sequences,
        max_request_tokens=args.max_request_tokens,
        max_new_tokens=args.max_new_tokens,
    )
    from ringzero.model.config import PrecisionPolicy
    from ringzero.rollout.engine.embedded import EmbeddedEngine
    from ringzero.rollout.server.app import RolloutServer

    conf = _from_config(args.config)
    policy = (
        PrecisionPolicy.preset(args.precision) if args.precision else (conf.precision or PrecisionPolicy())
    )
    if args.tokenizer is None and args.model_path and (Path(args.model_path) / "tokenizer.json").is_file():
        args.tokenizer = str(Path(args.model_path) / "tokenizer.json")  # the folder's own, as SGLang reads it
    tokenizer, tokenizer_path = _tokenizer(args.tokenizer, conf.tokenizer)
    model, model_path = load_source_model(args, policy, conf.model, s3=conf.s3)
    if tokenizer.vocab_size > model.cfg.vocab_size:
        raise RingzeroError(
            f"tokenizer has {tokenizer.vocab_size} ids but the model only {model.cfg.vocab_size}"
        )
    engine = EmbeddedEngine(
        model,
        tokenizer,
        policy,
        deterministic=bool(args.deterministic or conf.deterministic),
        max_batch=args.max_batch,
        weight_version=args.weight_version,
        seed=args.seed,
        s3=conf.s3,
    )
    return RolloutServer(
        engine,
        tokenizer,
        model_path=model_path,
        tokenizer_path=tokenizer_path,
        window_s=args.batch_window_ms / 1000.0,
        limits=limits,
        batching=args.batching,
    )

"""``ringzero export | import | convert``: Ling 2.5 model folders in and out of the checkpoint store.

ringzero export --checkpoint file://runs/store/stages/0123/final DIR   # a folder SGLang serves
ringzero export --init random --config configs/tiny-cpu.yaml DIR
ringzero import DIR --to file://runs/store/bases/ling-2.5              # a downloaded Ring/Ling 2.5
ringzero convert OLD_URI --to NEW_URI                                   # ringzero's earlier format
"""

from __future__ import annotations

import argparse

from ringzero.cli.model_source import add_model_source_args, load_source_model, refuse_config_with_checkpoint


def register(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write a checkpoint (or a random init) as a local Ling 2.5 model folder",
        description="The folder holds config.json (BailingMoeV2_5ForCausalLM), safetensors under "
        "the reference's names, generation_config.json and the tokenizer: what "
        "`sglang.launch_server --model-path DIR` and `ringzero serve --model-path DIR` load.",
    )
    add_model_source_args(
        p, "run config or bare model section (with --init random); its tokenizer is exported"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field of --config (run configs only), e.g. model.num_hidden_layers=8",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of --init random")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="stored tensor dtype")
    p.add_argument("dir", help="the folder to create (must not exist or be empty)")
    p.set_defaults(handler=_export)

    p = sub.add_parser(
        "import",
        help="commit a local Ling 2.5 / Ring 2.5 folder into the store",
        description="Checks config.json and every tensor's name and shape against it (naming each "
        "problem) before copying anything, then commits the folder as a checkpoint.",
    )
    p.add_argument("dir", help="a Hugging Face model folder of BailingMoeV2_5ForCausalLM")
    p.add_argument(
        "--to", required=True, metavar="URI", help="checkpoint URI to commit, file://... or s3://..."
    )
    p.add_argument(
        "--config", metavar="FILE", help="run config whose storage.s3 settings reach an s3:// store"
    )
    p.set_defaults(handler=_import)

    p = sub.add_parser("convert", help="rewrite a checkpoint of ringzero's earlier format as Ling 2.5")
    p.add_argument(
        "source", metavar="URI", help="checkpoint written by an earlier ringzero (RingzeroHybridLM)"
    )
    p.add_argument("--to", required=True, metavar="URI", help="checkpoint URI to commit")
    p.add_argument(
        "--config", metavar="FILE", help="run config whose storage.s3 settings reach an s3:// store"
    )
    p.set_defaults(handler=_convert)


def _s3(config_path):
    if not config_path:
        return None
    from ringzero.config.loader import load_config

    return load_config(config_path).storage.s3


def _store_and_name(uri: str, s3):
    from ringzero.store import open_store
    from ringzero.store.uri import parse_uri

    root, name = parse_uri(uri).parent()
    return open_store(str(root), s3), name


def _export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ringzero.errors import RingzeroError

    refuse_config_with_checkpoint(args)
    if args.init == "random" and args.config is None:
        raise RingzeroError("export --init random needs --config with a model section")
    import torch

    from ringzero.model.config import PrecisionPolicy
    from ringzero.model.hf_folder import write_folder
    from ringzero.tokenizer import CharTokenizer, build_tokenizer

    model_cfg, tokenizer = None, CharTokenizer()
    if args.config:
        from ringzero.config.loader import load_config, read_yaml

        if "run" in read_yaml(Path(args.config).read_text(), args.config):
            cfg = load_config(args.config, args.set)
            model_cfg, tokenizer = cfg.model, build_tokenizer(cfg.tokenizer)
        else:
            if args.set:
                raise RingzeroError("--set needs a run config (a bare model section has no keys to address)")
            from ringzero.cli.check_cmd import model_config_from_file

            model_cfg = model_config_from_file(args.config)
    model, label = load_source_model(args, PrecisionPolicy.preset("fp32"), model_cfg)
    if not model.cfg.reference_layout():
        raise RingzeroError(
            f"layout {model.cfg.layout!r} is not one the Ling 2.5 reference builds from "
            f"layer_group_size; only such models export"
        )
    files = write_folder(args.dir, model.cfg, model.state_dict(), tokenizer, getattr(torch, args.dtype))
    print(f"exported {label} to {args.dir}: {', '.join(sorted(files))}")
    return 0


def _import(args: argparse.Namespace) -> int:
    from ringzero.model.hf_folder import check_folder

    cfg = check_folder(args.dir)
    store, name = _store_and_name(args.to, _s3(args.config))
    uri = store.import_folder(args.dir, name, {"imported_from": str(args.dir)})
    kind = f"MoE, {cfg.num_experts} experts" if cfg.num_experts else "dense"
    print(f"imported {args.dir} ({cfg.num_hidden_layers} layers, {kind}) as {uri}")
    return 0


def _convert(args: argparse.Namespace) -> int:
    from ringzero.errors import RingzeroError
    from ringzero.model.checkpoint import check_tensors, save_state
    from ringzero.model.config import PrecisionPolicy
    from ringzero.model.hybrid import HybridLM
    from ringzero.model.legacy import convert, is_legacy
    from ringzero.tokenizer import CharTokenizer

    s3 = _s3(args.config)
    src_store, src_name = _store_and_name(args.source, s3)
    ckpt = src_store.load(src_name)
    if not is_legacy(ckpt.config):
        raise RingzeroError(f"{args.source}: already a Ling 2.5 checkpoint; nothing to convert")
    cfg, state, notes = convert(ckpt.config, ckpt.tensors, args.source)
    check_tensors(HybridLM(cfg, PrecisionPolicy.preset("fp32")), state, args.source)
    dst_store, dst_name = _store_and_name(args.to, s3)
    tokenizer = CharTokenizer() if cfg.vocab_size == CharTokenizer().vocab_size else None
    uri = save_state(dst_store, dst_name, cfg, state, {**ckpt.meta, "converted_from": args.source}, tokenizer)
    for note in notes:
        print(f"note: {note}")
    print(f"converted {args.source} to {uri}")
    return 0

"""``ringzero cluster plan``: every object a run's stages would create on Kubernetes, and whether they fit."""

from __future__ import annotations

import json

from ringzero.cli.config_cmd import add_config_args
from ringzero.errors import RingzeroError


def register(sub) -> None:
    p = sub.add_parser("cluster", help="plan a run on a Kubernetes cluster before anything is created")
    csub = p.add_subparsers(dest="cluster_command", metavar="ACTION")
    csub.required = True
    plan = csub.add_parser("plan", help="print each stage's objects and requests, and whether the run fits")
    add_config_args(plan)
    plan.add_argument(
        "--values",
        action="append",
        default=[],
        metavar="FILE",
        help="Helm values file of the install (repeatable, merged over the chart's values.yaml)",
    )
    plan.add_argument("--release", default="ringzero", help="Helm release name (names the service account)")
    plan.add_argument("--nodes", type=int, default=None, help="GPU nodes the run may use")
    plan.add_argument("--gpus-per-node", type=int, default=None, help="allocatable GPUs of each node")
    plan.add_argument(
        "--cpu-per-node", default=None, help="allocatable CPU of each node (quantity; default unchecked)"
    )
    plan.add_argument(
        "--memory-per-node",
        default=None,
        help="allocatable memory of each node (quantity, e.g. 2000Gi; default unchecked)",
    )
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    cost = plan.add_argument_group(
        "cost", "with --gpu: what the run costs on --nodes x --gpus-per-node GPUs (memory, time, rollout)"
    )
    cost.add_argument("--gpu", default=None, help="GPU kind of the nodes (h100, h200, b200)")
    cost.add_argument("--layout", default=None, help="price one layout: tp=N,pp=N,ep=N,cp=N (dp: the rest)")
    cost.add_argument("--search", action="store_true", help="every layout that fits, fastest first")
    cost.add_argument("--mfu", type=float, default=0.25, help="share of the bf16 peak a step reaches")
    cost.add_argument("--recompute", default="selective", help="none, selective or full (search: at least)")
    cost.add_argument(
        "--mem-fraction", type=float, default=0.9, help="share of a GPU's memory a training rank may use"
    )
    cost.add_argument(
        "--rollout-gpus", type=int, default=None, help="GPUs a rollout replica (default: fewest)"
    )
    plan.set_defaults(handler=_plan)


def _cost(args) -> int:
    from ringzero.config import load_config
    from ringzero.cost.gpus import gpu
    from ringzero.cost.plan import Assumptions, as_text, parse_layout, plan_layout, search, summary

    if args.nodes is None or args.gpus_per_node is None or args.nodes < 1 or args.gpus_per_node < 1:
        raise RingzeroError("--gpu needs --nodes and --gpus-per-node, each at least 1")
    if args.search == (args.layout is not None):
        raise RingzeroError("--gpu needs one of --layout tp=N,pp=N,ep=N,cp=N or --search")
    cfg = load_config(args.config, args.overrides)
    kind = gpu(args.gpu)
    assume = Assumptions(
        mfu=args.mfu, recompute=args.recompute, mem_fraction=args.mem_fraction, rollout_gpus=args.rollout_gpus
    )
    gpus = args.nodes * args.gpus_per_node
    if args.search:
        plans, refused = search(cfg, kind, args.nodes, args.gpus_per_node, assume)
    else:
        one = plan_layout(cfg, parse_layout(args.layout, gpus), kind, args.gpus_per_node, assume)
        plans, refused = [one], []
    head = summary(cfg, kind, args.nodes, args.gpus_per_node)
    if args.json:
        body = {
            **head,
            "layouts": [p.as_dict() for p in plans],
            "refused": [{"layout": p.layout.label(), "problems": p.problems} for p in refused],
        }
        print(json.dumps(body, indent=2))
    else:
        print(as_text(head, plans, refused, kind))
    if not any(p.fits for p in plans):
        raise RingzeroError(f"no layout of {gpus} x {kind.key} fits the run (reasons above)")
    return 0


def _plan(args) -> int:
    if args.gpu is not None:
        return _cost(args)
    if args.layout is not None or args.search:
        raise RingzeroError("--layout and --search price a run on GPUs: give --gpu (h100, h200, b200) too")
    from ringzero.cluster.capacity import Node, quantity
    from ringzero.cluster.plan import as_json, as_text, plan_run
    from ringzero.cluster.values import load_values, pipeline_overrides, settings_from_values
    from ringzero.config import load_config

    values = load_values(args.values)
    # What the installed pipeline runs: the config with the release's pipeline.overrides, then the user's.
    cfg = load_config(args.config, [*pipeline_overrides(values), *args.overrides])
    settings = settings_from_values(args.values, release=args.release, values=values)
    if (args.nodes is None) != (args.gpus_per_node is None):
        raise RingzeroError("give --nodes and --gpus-per-node together (the capacity to plan against)")
    if args.nodes is None:
        # No capacity given: the install's own shape, one node per job node, each with its GPUs.
        nodes = [Node(settings.gpus_per_node)] * settings.num_nodes
    else:
        if args.nodes < 1 or args.gpus_per_node < 0:
            raise RingzeroError("--nodes must be at least 1 and --gpus-per-node at least 0")
        cpu = None if args.cpu_per_node is None else quantity(args.cpu_per_node)
        memory = None if args.memory_per_node is None else quantity(args.memory_per_node)
        nodes = [Node(args.gpus_per_node, cpu, memory)] * args.nodes
    plans = plan_run(cfg, settings, nodes)
    print(json.dumps(as_json(plans, nodes), indent=2) if args.json else as_text(plans, nodes))
    bad = [p for p in plans if not p.fits]
    if bad:
        first = bad[0]
        raise RingzeroError(
            f"the run does not fit: stage {first.stage!r}: {first.problem or first.short}"
            + (f" (and {len(bad) - 1} more stage{'s' if len(bad) > 2 else ''})" if len(bad) > 1 else "")
        )
    return 0

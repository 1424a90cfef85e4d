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
    plan.set_defaults(handler=_plan)


def _plan(args) -> int:
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

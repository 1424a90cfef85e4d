"""Largest differences between training layouts: the micro run of the layout-invariance tests at
(dp, cp) = (2, 1), (1, 2), (2, 2) against one process (pretrain losses, RL metrics, final weights).

    python tests/parallel/layout_report.py
"""

from __future__ import annotations

import tempfile

import torch
from layout_jobs import run_layout

from ringzero.parallel.launch import RankPool

KEYS = ("loss/total", "ratio/p99", "ratio/max", "entropy/mean", "grad/norm")


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ref = run_layout(None, 1, 1, f"file://{tmp}/ref")
        print(
            "| layout | same tokens | pretrain loss | RL metrics (max abs) | pretrained weights | RL weights "
            "|"
        )
        print("| --- | --- | --- | --- | --- | --- |")
        with RankPool(2, timeout_s=600) as two, RankPool(4, timeout_s=600) as four:
            for dp, cp in ((2, 1), (1, 2), (2, 2)):
                pool = two if dp * cp == 2 else four
                got = pool.run(run_layout, dp, cp, f"file://{tmp}/{dp}x{cp}")[0]
                same = all(
                    a["output_ids"] == b["output_ids"]
                    for a, b in zip(ref["rl_steps"], got["rl_steps"], strict=True)
                )
                loss = max(
                    abs(a - b) for a, b in zip(ref["pretrain_losses"], got["pretrain_losses"], strict=True)
                )
                metrics = max(
                    abs(a["metrics"][k] - b["metrics"][k])
                    for a, b in zip(ref["rl_steps"], got["rl_steps"], strict=True)
                    for k in KEYS
                    if k in a["metrics"]
                )
                print(
                    f"| dp={dp} cp={cp} | {same} | {loss:.1e} | {metrics:.1e} | "
                    f"{max_diff(ref['pretrained'], got['pretrained']):.1e} | "
                    f"{max_diff(ref['rl_weights'], got['rl_weights']):.1e} |"
                )


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()

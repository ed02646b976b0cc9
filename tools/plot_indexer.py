#!/usr/bin/env python3
"""Plots the indexer stages of scripts/validate_indexer.sh: the dense warm-up's indexer KL loss and
the attention mass its top-k captures (against a random selection's expected k / visible keys), and
the sparse and dense continuations' LM losses.

Usage: python3 tools/plot_indexer.py runs/indexer docs/indexer_stages.png [--topk 128 --seq-len 1024]
Needs matplotlib (Debian: python3-matplotlib). Used for docs only.
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs")
    parser.add_argument("png")
    parser.add_argument("--topk", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=1024)
    args = parser.parse_args()
    # A uniformly random selection of min(k, t + 1) of the t + 1 visible keys captures (k / (t + 1)) of
    # any distribution in expectation; averaged over the window's positions.
    random_mass = sum(min(1.0, args.topk / (t + 1)) for t in range(args.seq_len)) / args.seq_len

    warm = read(os.path.join(args.runs, "warmup", "metrics.jsonl"))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    steps = [r["step"] for r in warm]
    left.plot(steps, [r["indexer_loss"] for r in warm], color="tab:blue", label="indexer KL loss (mean of layers)")
    left.set_xlabel("warm-up step")
    left.set_ylabel("KL (nats)", color="tab:blue")
    mass_axis = left.twinx()
    mass_axis.plot(steps, [r["indexer_selected_mass"] for r in warm], color="tab:green",
                   label="attention mass on the top-k")
    mass_axis.axhline(random_mass, color="gray", ls="--", label=f"random selection {random_mass:.3f}")
    mass_axis.set_ylim(0, 1)
    mass_axis.set_ylabel("selected mass", color="tab:green")
    lines = left.get_legend_handles_labels()
    more = mass_axis.get_legend_handles_labels()
    left.legend(lines[0] + more[0], lines[1] + more[1], loc="center right")
    left.set_title(f"dense warm-up (only the indexers learn), top-{args.topk} of ≤ {args.seq_len}")

    # Both continuations see the same batches, so their curves nearly coincide: dense is drawn dashed.
    for mode, color, style, marker in (("sparse", "tab:red", "-", "o"), ("dense", "tab:purple", "--", "s")):
        run = read(os.path.join(args.runs, mode, "metrics.jsonl"))
        right.plot([r["step"] for r in run], [r["lm_loss"] for r in run], style, color=color, lw=0.6, alpha=0.6,
                   label=f"{mode} continuation, train LM loss")
        val = [r for r in run if "val_loss" in r]
        right.plot([r["step"] for r in val], [r["val_loss"] for r in val], style, marker=marker, color=color,
                   markersize=8 if mode == "sparse" else 5, label=f"{mode} continuation, validation")
    right.set_xlabel("continuation step")
    right.set_ylabel("loss (nats/token)")
    right.legend()
    right.set_title("from the warm-up checkpoint: sparse vs dense attention")
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)


if __name__ == "__main__":
    main()

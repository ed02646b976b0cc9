#!/usr/bin/env python3
"""Plots a run's training loss (and validation loss where evaluated) from OUT/metrics.jsonl.

Usage: python3 tools/plot_metrics.py runs/demo/metrics.jsonl docs/demo_loss.png [--baseline NATS]
                                     [--label NAME] [--compare NAME=runs/other/metrics.jsonl ...]
With --compare, each other run's curves are drawn beside the first (same axes, own colour).
Needs matplotlib (Debian: python3-matplotlib). Used for docs only; nothing in the build or tests
depends on it.
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def read_curves(path):
    """(steps, train losses, validation steps, validation losses) of one metrics.jsonl."""
    steps, losses, val_steps, val_losses = [], [], [], []
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            steps.append(record["step"])
            losses.append(record["loss"])
            if "val_loss" in record:
                val_steps.append(record["step"])
                val_losses.append(record["val_loss"])
    return steps, losses, val_steps, val_losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics")
    parser.add_argument("png")
    parser.add_argument("--baseline", type=float, help="unigram baseline of the validation split (nats)")
    parser.add_argument("--label", default="", help="name of the first run in the legend")
    parser.add_argument("--compare", action="append", default=[], metavar="NAME=METRICS",
                        help="another run's metrics.jsonl to draw beside the first")
    args = parser.parse_args()

    runs = [(args.label, args.metrics)] + [tuple(item.split("=", 1)) for item in args.compare]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for index, (name, path) in enumerate(runs):
        steps, losses, val_steps, val_losses = read_curves(path)
        colour = f"C{2 * index}"
        prefix = f"{name} " if name else ""
        ax.plot(steps, losses, lw=0.8, color=colour, alpha=0.8, label=f"{prefix}train loss")
        if val_losses:
            ax.plot(val_steps, val_losses, "o-", color=f"C{2 * index + 1}", label=f"{prefix}validation loss")
    if args.baseline:
        ax.axhline(args.baseline, color="gray", ls="--", label=f"unigram baseline {args.baseline:.2f}")
        ax.axhline(0.75 * args.baseline, color="red", ls=":", label="0.75 × baseline")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)


if __name__ == "__main__":
    main()

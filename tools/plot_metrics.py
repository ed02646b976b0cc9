#!/usr/bin/env python3
"""Plots a run's training loss (and validation loss where evaluated) from OUT/metrics.jsonl.

Usage: python3 tools/plot_metrics.py runs/demo/metrics.jsonl docs/demo_loss.png [--baseline NATS]
Needs matplotlib (Debian: python3-matplotlib). Used for docs only; nothing in the build or tests
depends on it.
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics")
    parser.add_argument("png")
    parser.add_argument("--baseline", type=float, help="unigram baseline of the validation split (nats)")
    args = parser.parse_args()

    steps, losses, val_steps, val_losses = [], [], [], []
    with open(args.metrics) as f:
        for line in f:
            record = json.loads(line)
            steps.append(record["step"])
            losses.append(record["loss"])
            if "val_loss" in record:
                val_steps.append(record["step"])
                val_losses.append(record["val_loss"])

    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(steps, losses, lw=0.8, label="train loss")
    if val_losses:
        ax.plot(val_steps, val_losses, "o-", label="validation loss")
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

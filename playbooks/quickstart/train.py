"""Quickstart workload: a small MLP on the Iris data, a few seconds of training.

Writes metrics.json and preds.pt to --out. Deterministic for a given device, so
a CPU reference and a CPU (or MPS) target can be compared within tolerance.
"""

import argparse
import csv
import json
import os
import time

import torch
from torch import nn


def load(path):
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    x = torch.tensor(
        [
            [float(r[k]) for k in ("sepal_length", "sepal_width", "petal_length", "petal_width")]
            for r in rows
        ]
    )
    y = torch.tensor([int(r["species"]) for r in rows])
    return (x - x.mean(0)) / x.std(0), y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=300)
    ap.add_argument("--pause", type=float, default=0.02, help="seconds between epochs")
    args = ap.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    x, y = load(os.path.join(args.data, "iris.csv"))
    x, y = x.to(device), y.to(device)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    print(f"training on {device}: {len(x)} samples, {args.epochs} epochs", flush=True)
    for epoch in range(1, args.epochs + 1):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if epoch % 25 == 0:
            print(f"epoch {epoch:4d} loss {loss.item():.6f}", flush=True)
        time.sleep(args.pause)
    with torch.no_grad():
        logits = model(x)
    accuracy = (logits.argmax(1) == y).float().mean().item()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "metrics.json"), "w") as fh:
        json.dump({"loss": loss.item(), "accuracy": accuracy, "epochs": args.epochs}, fh)
    torch.save({"logits": logits.cpu()}, os.path.join(args.out, "preds.pt"))
    print(f"done: accuracy {accuracy:.4f}", flush=True)


if __name__ == "__main__":
    main()

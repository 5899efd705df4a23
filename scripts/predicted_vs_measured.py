#!/usr/bin/env python3
"""Predicted vs measured CPU step times.

Profiles this host (`autopar profile --backend cpu`), then for each zoo GPT
and rank count plans a run for this host, trains it a few times with
`autopar run --calibration` and prints the simulator's predicted step next to
the median of the measured step medians. Usage:

    cargo build --release && python3 scripts/predicted_vs_measured.py [runs]
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

AUTOPAR = os.environ.get("AUTOPAR", "target/release/autopar")
MODELS = [
    "gpt:layers=4,hidden=128,heads=4,vocab=512,seq=64",
    "gpt:layers=2,hidden=256,heads=8,vocab=1024,seq=64",
]
RANKS = [1, 2, 4]


def autopar(*args):
    return subprocess.run([AUTOPAR, *args], check=True, capture_output=True, text=True).stdout


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with tempfile.TemporaryDirectory() as tmp:
        cal = os.path.join(tmp, "cpu.json")
        autopar("profile", "--backend", "cpu", "-o", cal)
        print(f"{'model':<52} {'ranks':>5} {'predicted':>10} {'measured':>10} {'error':>7}")
        for model in MODELS:
            for ranks in RANKS:
                measured, predicted = [], None
                for _ in range(runs):
                    out = json.loads(autopar("run", model, "--plan", "auto", "--ranks", str(ranks),
                                             "--global-batch", "16", "--steps", "5",
                                             "--calibration", cal, "--json"))
                    measured.append(out["median_step_time_s"])
                    predicted = out["simulated_step_time_s"]
                m = statistics.median(measured)
                print(f"{model:<52} {ranks:>5} {predicted * 1e3:>8.1f}ms {m * 1e3:>8.1f}ms "
                      f"{(predicted / m - 1) * 100:>+6.1f}%")


if __name__ == "__main__":
    main()

"""The grouped-GEMM shares of engine/costs/model.py (``GROUPED_GEMM_SHARE``), from the measurements in
benchmarks/measured/h200_grouped_gemm.jsonl (benchmarks/gpu_grouped_gemm.py on one NVIDIA H200,
torch 2.11 ``torch._grouped_mm`` / ``torch._scaled_grouped_mm``, 2026-11-26).

For each measured MoE shape, the measured fraction of the dense peak is divided by soapbox's own
shape factor for that GEMM (tile and wave quantisation, K loop: what ``CostModel.gemm_fraction``
adds to the large-GEMM fraction), leaving the fraction a large grouped GEMM reaches. The two GEMMs
of an expert are combined weighted by their FLOPs (the first has 2/3: 2f wide against f), as a
harmonic mean (times add). fp8 was measured for the first GEMM only; its second is taken to lose
what bf16's second loses against its first. The share is that fraction over the dense large-GEMM
fraction soapbox uses for the H200 (MAMF, ``GEMM_FRACTION``): what a grouped GEMM keeps of a
dense one's rate, per precision.

    python benchmarks/fit_grouped_gemm.py
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.cluster import DEVICE_TYPES  # noqa: E402
from engine.costs import CostModel  # noqa: E402

DATA = ROOT / "benchmarks" / "measured" / "h200_grouped_gemm.jsonl"


def main() -> None:
    d = DEVICE_TYPES["H200-SXM-141GB"]
    cm = CostModel()
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    r1, r2, r8 = [], [], []
    for r in rows:
        if r["what"] != "grouped":
            continue
        G, M, h, f = r["G"], r["M"], r["h"], r["f"]

        def shape(m, n, k, prec):
            return cm.gemm_fraction(m, n, k, d, prec) / cm.large_gemm_fraction(d, prec)

        r1.append(r["bf16_tflops1"] * 1e12 / d.peak("bf16") / shape(G * M, 2 * f, h, "bf16"))
        r2.append(r["bf16_tflops2"] * 1e12 / d.peak("bf16") / shape(G * M, h, f, "bf16"))
        r8.append(r["fp8_tflops1"] * 1e12 / d.peak("fp8") / shape(G * M, 2 * f, h, "fp8"))
    g1, g2, g8 = statistics.mean(r1), statistics.mean(r2), statistics.mean(r8)
    bf16 = 3 / (2 / g1 + 1 / g2)
    fp8 = g8 * bf16 / g1
    print(f"{len(r1)} shapes; large grouped fraction bf16: first GEMM {g1:.3f}, second {g2:.3f}, both {bf16:.3f}; "
          f"fp8 first {g8:.3f}, both {fp8:.3f}")
    print(f"GROUPED_GEMM_SHARE = {{\"bf16\": {bf16 / cm.large_gemm_fraction(d, 'bf16'):.3f}, "
          f"\"fp8\": {fp8 / cm.large_gemm_fraction(d, 'fp8'):.3f}}}")


if __name__ == "__main__":
    main()

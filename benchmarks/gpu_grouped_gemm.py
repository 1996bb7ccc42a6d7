"""Measure on a Hopper GPU what an MoE layer's kernels reach (issue 26): grouped GEMMs
(``torch._grouped_mm``, bf16; ``torch._scaled_grouped_mm``, fp8 rowwise, where the build has
them) at the published MoE models' per-rank shapes against a large dense GEMM, and the token
permutation's gather bandwidth. Prints one JSON line per measurement.

    python benchmarks/gpu_grouped_gemm.py > grouped.jsonl   (on a machine with a CUDA GPU)

Per-rank shapes (tokens per microbatch and rank x top-k / local experts = rows per expert):
local experts G, rows per expert M, hidden K, first GEMM width N1 = 2 x expert FFN, second
GEMM (M x f) . (f x h)."""

import json
import sys

import torch

dev = "cuda"
torch.backends.cuda.matmul.allow_tf32 = False


def bench(fn, reps=20, warm=5):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    times.sort()
    return times[len(times) // 2]


def emit(**kw):
    print(json.dumps(kw), flush=True)


emit(what="device", name=torch.cuda.get_device_name(), torch=torch.__version__,
     sms=torch.cuda.get_device_properties(0).multi_processor_count,
     grouped=hasattr(torch, "_grouped_mm"), scaled_grouped=hasattr(torch, "_scaled_grouped_mm"))

n = 8192
a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
t = bench(lambda: a @ b)
emit(what="dense", m=n, n=n, k=n, s=t, tflops=2 * n ** 3 / t / 1e12)
del a, b

# (model, G local experts, M rows per expert, h, f)
SHAPES = [("qwen3-30b-a3b ep8 mbs1", 16, 2048, 2048, 768), ("qwen3-30b-a3b ep8 mbs2", 16, 4096, 2048, 768),
          ("qwen3-30b-a3b ep16", 8, 4096, 2048, 768), ("qwen3-235b-a22b ep32 tp2sp", 4, 4096, 4096, 1536),
          ("deepseek-v3 ep64 tp2sp", 4, 4096, 7168, 2048), ("gpt-oss-120b ep8 mbs1", 16, 1024, 2880, 2880),
          ("gpt-oss-120b ep8 mbs4", 16, 4096, 2880, 2880), ("mixtral ep8", 1, 8192, 4096, 14336)]

for name, G, M, h, f in SHAPES:
    x = torch.randn(G * M, h, device=dev, dtype=torch.bfloat16)
    w1 = torch.randn(G, h, 2 * f, device=dev, dtype=torch.bfloat16)
    y = torch.randn(G * M, f, device=dev, dtype=torch.bfloat16)
    w2 = torch.randn(G, f, h, device=dev, dtype=torch.bfloat16)
    offs = torch.arange(M, G * M + 1, M, device=dev, dtype=torch.int32)
    fl1, fl2 = 2 * G * M * h * 2 * f, 2 * G * M * f * h
    res = {"what": "grouped", "model": name, "G": G, "M": M, "h": h, "f": f}
    try:
        res["bf16_gemm1_s"] = bench(lambda: torch._grouped_mm(x, w1, offs=offs))
        res["bf16_gemm2_s"] = bench(lambda: torch._grouped_mm(y, w2, offs=offs))
        res["bf16_tflops1"] = fl1 / res["bf16_gemm1_s"] / 1e12
        res["bf16_tflops2"] = fl2 / res["bf16_gemm2_s"] / 1e12
    except Exception as e:  # noqa: BLE001
        res["bf16_error"] = str(e)[:200]
    # one GEMM per expert in a loop, for comparison
    xs, ys = x.view(G, M, h), y.view(G, M, f)
    res["loop_gemm1_s"] = bench(lambda: [xs[i] @ w1[i] for i in range(G)])
    res["loop_tflops1"] = fl1 / res["loop_gemm1_s"] / 1e12
    try:
        x8 = x.to(torch.float8_e4m3fn)
        w18 = w1.transpose(-2, -1).contiguous().to(torch.float8_e4m3fn).transpose(-2, -1)
        sa = torch.ones(G * M, device=dev, dtype=torch.float32)
        sb = torch.ones(G, 2 * f, device=dev, dtype=torch.float32)
        res["fp8_gemm1_s"] = bench(lambda: torch._scaled_grouped_mm(x8, w18, sa, sb, offs=offs,
                                                                   out_dtype=torch.bfloat16))
        res["fp8_tflops1"] = fl1 / res["fp8_gemm1_s"] / 1e12
    except Exception as e:  # noqa: BLE001
        res["fp8_error"] = str(e)[:200]
    # permute: gather top-k copies of T tokens (T = G*M/8 tokens, top-8) into expert order
    T = G * M // 8
    src = torch.randn(T, h, device=dev, dtype=torch.bfloat16)
    idx = torch.randint(0, T, (G * M,), device=dev)
    res["gather_s"] = bench(lambda: src.index_select(0, idx))
    res["gather_GBps"] = (G * M * h * 2 * 2) / res["gather_s"] / 1e9  # read + write
    out = torch.zeros(T, h, device=dev, dtype=torch.bfloat16)
    res["scatter_add_s"] = bench(lambda: out.index_add_(0, idx, x))
    res["scatter_add_GBps"] = (G * M * h * 2 * 3) / res["scatter_add_s"] / 1e9
    emit(**res)
    del x, w1, y, w2, src, out
    torch.cuda.empty_cache()

"""Decoding speed with and without the KV cache, and this machine's roofline, side by side in one run.

    python bench/decode_bench.py            # contexts 64 .. 4096 (~2.5 min on 2 cores), writes bench/results/
    python bench/decode_bench.py --quick    # contexts 64, 256, 1024, prints the tables (~15 s)

Model: the capstone-sized GPT of chapter 14 (``selfattn.inference.decode_timing.CAPSTONE_SIZES``:
d_model 64, 4 heads, 2 layers, d_ff 256, RoPE, vocabulary 94), untrained (timing does not depend on
the weights), float32, CPU, greedy, under ``torch.no_grad``. For each prompt length L, tokens per
second of the generated tokens after the prompt (the cached prefill is paid once and not counted;
without the cache every step recomputes the whole sequence), cached and uncached runs alternated,
median of repeats (:func:`selfattn.inference.decode_timing.time_decode`).

Roofline (:func:`selfattn.inference.costs.measure_roofline`): the float32 matmul rate, the read
bandwidth of a 256 MiB sum, and one decode step of attention (H=8, d_head=64, S=65536: K and V are
256 MiB; larger than the last-level cache of typical machines, the header prints this one's L3),
interleaved, medians; with the verdict of ``memory_bound_verdict`` (memory-bound by the roofline:
counted intensity below the measured balance; the measured share of the streaming bandwidth reported
beside it). The cost-model table gives each published model at 4k tokens, or "n/a" where the model
was trained for fewer.
``OMP_WAIT_POLICY=PASSIVE`` is set unless given, as in ``attention_bench.py`` (and see
``time_decode``'s ``num_threads``: with spinning OpenMP threads a cached step of this small model
costs 30x more on a busy machine). Chapter 11 may load the results file.
"""

from __future__ import annotations

import os

# Before torch is imported: OpenMP threads that wait sleep instead of spinning (see attention_bench.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

import torch
from bench_machine import cpu_name, vector_isa  # bench/, the folder of this script

from selfattn.inference.costs import (
    PUBLISHED_ACCELERATORS,
    PUBLISHED_SPECS,
    ModelSpec,
    decode_step_cost,
    measure_roofline,
    memory_bound_verdict,
    prefill_cost,
)
from selfattn.inference.decode_timing import capstone_sized_gpt, time_decode

CONTEXTS = (64, 128, 256, 512, 1024, 2048, 4096)
QUICK_CONTEXTS = (64, 256, 1024)
RESULTS = Path(__file__).resolve().parent / "results"


def _mib(n_bytes) -> str:
    return "not reported" if n_bytes is None else f"{n_bytes / 2**20:g} MiB"


def render(timing, roof, verdict, meta) -> str:
    lines = [f"# Decoding with and without the KV cache, and the roofline ({meta['date']})", "",
             f"Machine: {meta['cpu']}, vector ISA {meta['isa']}; {meta['threads']} torch threads, torch "
             f"{meta['torch']}; OMP_WAIT_POLICY={meta['omp_wait_policy']}; 1-minute load average {meta['load']} "
             "(a shared machine: other jobs may have run during the measurement); L3 cache "
             f"{_mib(roof.l3_cache_bytes)} (the roofline's arrays are 256 MiB).", "",
             f"Model: capstone-sized GPT ({meta['model']}), untrained, float32, greedy, batch 1; "
             f"{timing.n_new} timed tokens per run, median of {timing.repeats} alternated rounds. Cached: the "
             "prefill of the prompt is not counted (paid once per prompt).", "",
             "## Tokens per second against context length", "",
             "| context L | cached tok/s | uncached tok/s | cached / uncached | cached ms/token | uncached ms/token |",
             "|---:|---:|---:|---:|---:|---:|"]
    tps, spt = timing.tokens_per_second, timing.seconds_per_token
    for i, L in enumerate(timing.context_lengths):
        lines.append(f"| {L} | {tps[True][i]:.1f} | {tps[False][i]:.1f} | {timing.speedup[i]:.2f} "
                     f"| {1e3 * spt[True][i]:.2f} | {1e3 * spt[False][i]:.2f} |")
    H, S, Dh = roof.decode_shape
    lines += ["", "## Roofline of this machine (float32)", "",
              "| quantity | value |", "|:---|---:|",
              f"| matmul rate ({roof.matmul_n} x {roof.matmul_n}) | {roof.matmul_flops_per_s / 1e9:.1f} GFLOP/s |",
              f"| read bandwidth (sum of {roof.bandwidth_bytes / 2**20:.0f} MiB) | "
              f"{roof.bandwidth_bytes_per_s / 1e9:.1f} GB/s |",
              f"| machine balance | {roof.balance:.2f} FLOP/byte |",
              f"| decode attention (H={H}, S={S}, d_head={Dh}) achieved | {roof.decode_flops_per_s / 1e9:.2f} GFLOP/s, "
              f"{roof.decode_bytes_per_s / 1e9:.1f} GB/s |",
              f"| decode attention intensity | {roof.decode_intensity:.2f} FLOP/byte |",
              f"| decode attention / matmul rate | {roof.decode_flops_per_s / roof.matmul_flops_per_s:.1%} |",
              f"| decode attention / bandwidth | {verdict.bandwidth_share:.0%} |",
              "", f"Verdict: {verdict.statement}.", "",
              "## Intensity of a decode step and a prefill (cost model, bfloat16, batch 1), and published balance", "",
              "| model | decode at 4k (FLOP/byte) | prefill of 4k (FLOP/byte) |", "|:---|---:|---:|"]
    for spec in meta["specs"]:
        if spec.max_context is not None and spec.max_context < 4096:
            lines.append(f"| {spec.name} | n/a (trained for {spec.max_context} tokens) | n/a |")
            continue
        lines.append(f"| {spec.name} | {decode_step_cost(spec, 4096).intensity:.2f} "
                     f"| {prefill_cost(spec, 4096).intensity:.0f} |")
    lines += ["", "| accelerator (datasheet, dense BF16) | TFLOP/s | TB/s | balance (FLOP/byte) |",
              "|:---|---:|---:|---:|"]
    for acc in PUBLISHED_ACCELERATORS.values():
        lines.append(f"| {acc.name} | {acc.flops_per_s / 1e12:.0f} | {acc.bytes_per_s / 1e12:.3g} | {acc.balance:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="contexts 64, 256, 1024 only; for a smoke test")
    parser.add_argument("--out", type=Path, default=None,
                        help="markdown file to write (default for a full run: bench/results/decode-cpu-<date>.md)")
    args = parser.parse_args(argv)

    load_start = os.getloadavg()
    contexts = QUICK_CONTEXTS if args.quick else CONTEXTS
    model = capstone_sized_gpt(seed=0)
    timing = time_decode(model, contexts, n_new=4 if args.quick else 8, repeats=3 if args.quick else 5)
    print("  decode timed", file=sys.stderr, flush=True)
    roof = measure_roofline(repeats=5 if args.quick else 9)
    verdict = memory_bound_verdict(roof)
    today = dt.date.today().isoformat()
    c = model.config
    meta = {"date": today, "cpu": cpu_name(), "isa": vector_isa(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "load": f"{load_start[0]:.1f} at start, {os.getloadavg()[0]:.1f} at the end",
            "model": f"d_model {c.d_model}, {c.n_heads} heads, {c.n_layers} layers, d_ff {c.d_ff}, {c.positions}, "
                     f"vocabulary {c.vocab_size}",
            "specs": [ModelSpec.from_gpt_config(c, name="capstone GPT (this bench)"), *PUBLISHED_SPECS.values()]}
    table = render(timing, roof, verdict, meta)
    print(table)
    out = args.out if args.out is not None else (None if args.quick else RESULTS / f"decode-cpu-{today}.md")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(table)
        record = {"meta": {k: v for k, v in meta.items() if k != "specs"},
                  "context_lengths": timing.context_lengths,
                  "seconds_per_token": {"cached": timing.seconds_per_token[True],
                                        "uncached": timing.seconds_per_token[False]},
                  "n_new": timing.n_new, "repeats": timing.repeats,
                  "roofline": {"matmul_flops_per_s": roof.matmul_flops_per_s,
                               "bandwidth_bytes_per_s": roof.bandwidth_bytes_per_s,
                               "decode_flops_per_s": roof.decode_flops_per_s,
                               "decode_bytes_per_s": roof.decode_bytes_per_s,
                               "decode_intensity": roof.decode_intensity, "balance": roof.balance,
                               "matmul_n": roof.matmul_n, "bandwidth_bytes": roof.bandwidth_bytes,
                               "decode_shape": list(roof.decode_shape), "seconds": roof.seconds,
                               "l3_cache_bytes": roof.l3_cache_bytes,
                               "memory_bound": verdict.memory_bound,
                               "bandwidth_share": verdict.bandwidth_share,
                               "near_memory_roof": verdict.near_memory_roof,
                               "flops_fraction": verdict.flops_fraction}}
        out.with_suffix(".json").write_text(json.dumps(record, indent=1))
        print(f"wrote {out} and {out.with_suffix('.json')}", file=sys.stderr)


if __name__ == "__main__":
    main()

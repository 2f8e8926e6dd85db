"""One decode step of the course's GPT against what a user would pick instead, in one interleaved run.

    python bench/decode_compare.py            # 2 sizes x batch 1, 8 x contexts 128 .. 4096 (~6-10 min on 2 cores)
    python bench/decode_compare.py --quick    # capstone size, contexts 128 and 1024, batch 1 and 8 (~1 min)

Engines, each timed on the same decode step (one new token per sequence, its logits and the greedy argmax;
no sampling, no prefill):

- ``course eager``: :class:`selfattn.models.gpt.GPT`'s own decode step, the one :meth:`GPT.generate`
  runs after the prompt (``GPT._forward_new`` over a :class:`~selfattn.efficient.StaticKVCache` per
  layer, written in place);
- ``course compiled``: the same step under ``torch.compile`` (inductor, ``dynamic=True``: one
  compilation per size and batch serves every context), the floor that the arithmetic costs without
  Python's overhead;
- ``HF dynamic`` / ``HF static``: ``transformers``' ``LlamaForCausalLM`` of the same size (d_model,
  heads, key/value heads = heads, layers, vocabulary, RoPE base 10000, and ``intermediate_size`` =
  :func:`hf_intermediate_size` (d_ff), 2/3 of d_ff rounded, so that its three feed-forward matrices
  hold as many numbers as the course's two),
  random weights, its default attention (``sdpa``), with a ``DynamicCache`` (a ``torch.cat`` per step)
  and with a ``StaticCache`` of ``max_cache_len`` = context + 1.

The caches are filled to context L with random keys and values of the right shape instead of a real
prefill (the timing of a step does not depend on what the cache holds), for every engine alike; after
each step the cache is put back to length L (``crop(-1)`` for transformers, the length for the course),
so that every timed step reads a cache of length L and writes position L. Sizes: the capstone's
(:data:`selfattn.inference.decode_timing.CAPSTONE_SIZES`: d_model 64, 4 heads, 2 layers, d_ff 256,
vocabulary 94) and GPT-2 small's (12 layers, d_model 768, 12 heads, d_ff 3072, vocabulary 50257).
Not the same model in every detail: the course's GPT has biases, LayerNorm and a GELU feed-forward of
two d_model x d_ff matrices; Llama has no biases, RMSNorm and a SwiGLU feed-forward of three
d_model x (2/3 d_ff) matrices. The weight matrices then match (exactly at GPT-2 small's d_ff 3072; at
the capstone's 256, 2/3 rounds to 171: 64 numbers more per layer, 0.1 % of the model); what
differs is the course's biases and norm offsets (its LayerNorms have a bias, RMSNorm has none):
:func:`parameter_counts` gives both counts and ``tests/unit/test_decode_compare_sizes.py`` checks them
against the built models. Results written before 2026-12-03's fix ran Llama at intermediate_size = d_ff
(1.5x the feed-forward weights and arithmetic) and need a rerun. float32, CPU, ``torch.no_grad``.

Per point (size, batch, context), ``--rounds`` rounds; in each round every engine runs ``--steps``
steps in turn (the order rotates from round to round); an engine's time at the point is the median over
rounds of its mean step time. ``OMP_WAIT_POLICY=PASSIVE`` unless given (see attention_bench.py).
Writes ``bench/results/decode-compare-cpu-<date>.md`` and ``.json`` (``--out`` to choose;
``--quick`` writes nothing unless ``--out`` is given). Chapter 11 plots the newest
``decode-compare-*.json``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported

import argparse
import datetime as dt
import gc
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from bench_machine import cpu_name, vector_isa  # bench/, the folder of this script

from selfattn.efficient import StaticKVCache
from selfattn.inference.decode_timing import CAPSTONE_SIZES
from selfattn.models.gpt import GPT, CachePlan, GPTConfig, _GrowingCache, _StaticCache

RESULTS = Path(__file__).resolve().parent / "results"
ENGINES = ("course eager", "course compiled", "HF dynamic", "HF static")
SIZES = {
    "capstone": {k: CAPSTONE_SIZES[k] for k in ("vocab_size", "d_model", "n_heads", "n_layers", "d_ff")},
    "gpt2-small": {"vocab_size": 50257, "d_model": 768, "n_heads": 12, "n_layers": 12, "d_ff": 3072},
}
BATCHES = (1, 8)
CONTEXTS = (128, 512, 1024, 2048, 4096)
QUICK = {"sizes": ("capstone",), "contexts": (128, 1024)}
FLAT = 1.2  # (c): a step "not flat" once it costs more than FLAT x the smallest context's
WITHIN = 1.5  # (b): eager within WITHIN x compiled


class _ViewCache(_GrowingCache):
    """The compiled step's cache: views (B, H, L + 1, Dh) of the same buffers the eager step's
    StaticKVCache holds; the step writes position L (``L`` from the view's shape, so that one
    dynamic-shape compilation serves every context) and reads all L + 1, as ``_StaticCache`` does."""

    def __init__(self, k, v):
        self.k, self.v = k, v

    def plan(self, T, scheme, device):
        L = self.k.shape[-2] - 1
        return CachePlan(L, L, L + 1, None)

    def update(self, k_new, v_new, rotate):
        L = self.k.shape[-2] - 1
        self.k[..., L:, :] = rotate(k_new, L)
        self.v[..., L:, :] = v_new
        return self.k, self.v


def _course_model(size: dict) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=64, positions="rope", **size)).eval()


def hf_intermediate_size(d_ff: int) -> int:
    """Llama's ``intermediate_size`` for a course GPT of feed-forward width ``d_ff`` (int > 0).

    SwiGLU has three d_model x intermediate matrices (gate, up, down) where the course's GELU
    feed-forward has two d_model x d_ff: 2/3 of d_ff, rounded to the nearest integer, holds as many
    weights (Shazeer 2020, "GLU variants improve Transformer", section 2, does the same).
    Raises ValueError if d_ff is not a positive int."""
    if isinstance(d_ff, bool) or not isinstance(d_ff, int) or d_ff <= 0:
        raise ValueError(f"d_ff must be a positive int, got {d_ff!r}")
    return max(1, round(2 * d_ff / 3))


def _hf_config(size: dict):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=size["vocab_size"], hidden_size=size["d_model"],
                       intermediate_size=hf_intermediate_size(size["d_ff"]),
                       num_hidden_layers=size["n_layers"], num_attention_heads=size["n_heads"],
                       num_key_value_heads=size["n_heads"], max_position_embeddings=8192, rope_theta=10000.0)


def parameter_counts(size: dict) -> dict:
    """Parameters of the two models at ``size`` (a SIZES entry), counted from the shapes, not built.

    Returns {"course": int, "hf": int, "matrices_course": int, "matrices_hf": int}: all parameters,
    and those of the weight matrices alone (embedding, read-out, attention and feed-forward). The
    course's GPT (untied, RoPE): per layer W_Q, W_K, W_V, W_O (D x D) with their biases, a feed-forward
    of D x F and F x D with biases, two LayerNorms (weight and bias); a final LayerNorm; embedding and
    read-out (V x D) and the read-out's bias. Llama: per layer four D x D projections, three D x I
    (I = hf_intermediate_size(F)), two RMSNorm weights; a final RMSNorm; embedding and lm_head."""
    D, F, V, n = size["d_model"], size["d_ff"], size["vocab_size"], size["n_layers"]
    inter = hf_intermediate_size(F)
    matrices_course = n * (4 * D * D + 2 * D * F) + 2 * V * D
    matrices_hf = n * (4 * D * D + 3 * D * inter) + 2 * V * D
    course = matrices_course + n * (4 * D + F + D + 4 * D) + 2 * D + V
    hf = matrices_hf + n * 2 * D + D
    return {"course": course, "hf": hf, "matrices_course": matrices_course, "matrices_hf": matrices_hf}


def _hf_model(size: dict):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(_hf_config(size)).eval()


def _engines(model: GPT, compiled, hf, B: int, L: int, generator):
    """The four steps at batch B and context L, with their caches filled to L: {engine: step()}."""
    from transformers import DynamicCache, StaticCache

    c = model.config
    H, Dh = c.n_heads, c.d_model // c.n_heads
    weight = model.token_embedding.weight  # (V, D)
    tok = torch.randint(0, c.vocab_size, (B, 1), generator=generator)  # (B, 1)

    own = []
    for _ in model.blocks:
        cache = StaticKVCache(L + 1)
        cache._write(torch.randn(B, H, L, Dh, generator=generator), torch.randn(B, H, L, Dh, generator=generator))
        own.append(_StaticCache(cache))
    views = ([o.cache._k for o in own], [o.cache._v for o in own])  # (B, H, L + 1, Dh) each

    def eager():
        for o in own:
            o.cache._length = L  # back to context L: this step reads L + 1 keys and writes position L
        plan = own[0].plan(1, model.positions, tok.device)
        return model._forward_new(weight[tok], own, plan, plan.keep, model.positions)[0][:, -1].argmax(-1)

    def comp():
        return compiled(weight[tok], *views)

    dynamic, static = DynamicCache(config=hf.config), StaticCache(config=hf.config, max_cache_len=L + 1)
    for i in range(c.n_layers):
        k, v = torch.randn(B, H, L, Dh, generator=generator), torch.randn(B, H, L, Dh, generator=generator)
        dynamic.update(k, v, i)
        static.update(k, v, i)
    del k, v

    def hf_step(cache):
        def step():
            out = hf(tok, cache=cache, use_cache=True).logits[:, -1].argmax(-1)
            cache.crop(-1)  # back to context L
            return out
        return step

    return {"course eager": eager, "course compiled": comp, "HF dynamic": hf_step(dynamic),
            "HF static": hf_step(static)}


def _compiled_step(model: GPT):
    def step(tokens, ks, vs):  # tokens (B, 1, D); ks, vs: per layer (B, H, L + 1, Dh)
        caches = [_ViewCache(k, v) for k, v in zip(ks, vs, strict=True)]
        plan = caches[0].plan(1, None, None)
        return model._forward_new(tokens, caches, plan, None, model.positions)[0][:, -1].argmax(-1)

    model.positions.rotate(torch.zeros(1, 1, 1, model.config.d_model // model.config.n_heads), 8192)  # grow RoPE's table
    return torch.compile(step, dynamic=True)


def measure(sizes, batches, contexts, rounds: int, steps: int, log=print):
    """{size: {batch: {engine: [seconds per step at each context]}}}, and the compile seconds."""
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    generator = torch.Generator().manual_seed(0)
    seconds = {}
    compile_seconds = {}
    with torch.no_grad():
        for name in sizes:
            model, hf = _course_model(SIZES[name]), _hf_model(SIZES[name])
            compiled = _compiled_step(model)
            seconds[name] = {}
            for B in batches:
                seconds[name][B] = {e: [] for e in ENGINES}
                for L in contexts:
                    steps_of = _engines(model, compiled, hf, B, L, generator)
                    t0 = time.perf_counter()
                    got = {e: f() for e, f in steps_of.items()}  # warm-up (and the compilation, once per B)
                    if L == contexts[0]:
                        compile_seconds[f"{name}, batch {B}"] = time.perf_counter() - t0
                    if not torch.equal(got["course eager"], got["course compiled"]):
                        raise AssertionError(f"{name} B={B} L={L}: eager and compiled steps disagree")
                    per_round = {e: [] for e in ENGINES}
                    for r in range(rounds):
                        order = ENGINES[r % 4:] + ENGINES[:r % 4]
                        for e in order:
                            f = steps_of[e]
                            t = time.perf_counter()
                            for _ in range(steps):
                                f()
                            per_round[e].append((time.perf_counter() - t) / steps)
                    for e in ENGINES:
                        seconds[name][B][e].append(statistics.median(per_round[e]))
                    log(f"  {name} B={B} L={L}: " + ", ".join(
                        f"{e} {1e3 * seconds[name][B][e][-1]:.2f} ms" for e in ENGINES))
                    del steps_of
                    gc.collect()
            del model, hf, compiled
            torch._dynamo.reset()
    return seconds, compile_seconds


def _weight_bytes(size: dict) -> int:
    """Bytes of the course model's float32 parameters, read once per step."""
    D, F, V, n = size["d_model"], size["d_ff"], size["vocab_size"], size["n_layers"]
    per_layer = 4 * D * D + 4 * D + 2 * D * F + F + D + 4 * D
    return 4 * (n * per_layer + 2 * V * D + V + 2 * D)


def _cache_bytes(size: dict, B: int, L: int) -> int:
    """Bytes of keys and values a step reads at context L (float32, every layer)."""
    return 4 * 2 * size["n_layers"] * B * L * size["d_model"]


def verdicts(seconds, contexts) -> dict:
    """The three targets of issue 30 item 3, each {"met": bool, "text": str}, from the step times."""
    worst_a = {}
    for e in ("HF dynamic", "HF static"):
        ratios = [(s[e][i] / s["course eager"][i], name, B, L)  # > 1: the course's eager step is faster
                  for name, by_b in seconds.items() for B, s in by_b.items() for i, L in enumerate(contexts)]
        worst_a[e] = min(ratios)
    met_a = all(r >= 1.0 for r, *_ in worst_a.values())
    text_a = "; ".join(f"slowest against {e}: {r:.2f}x {e}'s tokens/s ({name}, batch {B}, context {L})"
                       for e, (r, name, B, L) in worst_a.items())
    out = {"a": {"met": met_a, "text": f"the course's eager decode at least as fast as transformers' at every "
                                       f"point: {'MET' if met_a else 'MISSED'}; {text_a}"}}
    if "capstone" in seconds:
        ratios = [(s["course eager"][i] / s["course compiled"][i], B, L)
                  for B, s in seconds["capstone"].items() for i, L in enumerate(contexts)]
        worst = max(ratios)
        met_b = worst[0] <= WITHIN
        out["b"] = {"met": met_b, "text": f"the eager step at the capstone size within {WITHIN}x of the compiled "
                                          f"step: {'MET' if met_b else 'MISSED'}; largest eager / compiled "
                                          f"{worst[0]:.2f}x (batch {worst[1]}, context {worst[2]}), smallest "
                                          f"{min(ratios)[0]:.2f}x"}
    parts, met_c = [], True
    for name, by_b in seconds.items():
        for B, s in by_b.items():
            t = s["course eager"]
            base = t[0]
            over = next((L for L, x in zip(contexts, t, strict=True) if x > FLAT * base), None)
            cross = next((L for L in contexts if _cache_bytes(SIZES[name], B, L) > _weight_bytes(SIZES[name])), None)
            # flat while the cache is smaller than the weights: the first context past FLAT x is one where
            # the cache's bytes already exceed the weights' (or none is)
            ok = over is None or (cross is not None and over >= cross)
            met_c &= ok
            parts.append(f"{name} batch {B}: {t[-1] / base:.2f}x the step time of context {contexts[0]} at "
                         f"{contexts[-1]}, first above {FLAT}x at "
                         f"{'no context measured' if over is None else f'context {over}'}; the cache's bytes "
                         f"pass the weights' at {'no context measured' if cross is None else f'context {cross}'}")
    out["c"] = {"met": met_c, "text": f"step time flat in context (within {FLAT}x of the smallest context's) until "
                                      f"reading the cache dominates (its bytes exceed the weights'): "
                                      f"{'MET' if met_c else 'MISSED'}; " + "; ".join(parts)}
    return out


def _tps(x: float) -> str:
    """Tokens per second to three significant figures or more (GPT-2 small's are single digits on a CPU)."""
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def render(seconds, contexts, verdict, meta) -> str:
    lines = [f"# One decode step: the course's GPT against transformers and torch.compile ({meta['date']})", "",
             f"Machine: {meta['cpu']}, vector ISA {meta['isa']}; {meta['threads']} torch threads; torch "
             f"{meta['torch']}, transformers {meta['transformers']}; OMP_WAIT_POLICY={meta['omp_wait_policy']}; "
             f"1-minute load average {meta['load_start']:.2f} at start, {meta['load_end']:.2f} at the end "
             f"({meta['wall_seconds']:.0f} s in all; compilations: {meta['compile_text']})."
             + (f" {meta['note']}" if meta.get("note") else ""), "",
             "What is timed: one decode step (one new token per sequence, logits and greedy argmax) at context L. "
             "The caches are filled to L with random keys and values of the right shape instead of a real "
             "prefill, for every engine alike, and put back to L after each step: every timed step reads a "
             f"cache of length L. Median over {meta['rounds']} interleaved rounds of the mean of {meta['steps']} "
             "steps. float32, random weights. transformers: LlamaForCausalLM of the same size (sdpa attention; "
             "no biases, RMSNorm, SwiGLU with three d_model x intermediate_size matrices, intermediate_size "
             "2/3 of the course's d_ff, against the course's two d_model x d_ff).", "",
             "## Tokens per second", ""]
    for name, by_b in seconds.items():
        for B, s in by_b.items():
            size = SIZES[name]
            lines += [f"### {name} (d_model {size['d_model']}, {size['n_heads']} heads, {size['n_layers']} layers, "
                      f"d_ff {size['d_ff']}, vocabulary {size['vocab_size']}), batch {B}", "",
                      "| context | course eager | course compiled | HF dynamic | HF static | eager / HF dynamic "
                      "| eager / HF static | eager / compiled (time) | eager ms/step |",
                      "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for i, L in enumerate(contexts):
                tps = {e: B / s[e][i] for e in ENGINES}
                lines.append(f"| {L} | " + " | ".join(_tps(tps[e]) for e in ENGINES)
                             + f" | {tps['course eager'] / tps['HF dynamic']:.2f} "
                             f"| {tps['course eager'] / tps['HF static']:.2f} "
                             f"| {s['course eager'][i] / s['course compiled'][i]:.2f} "
                             f"| {1e3 * s['course eager'][i]:.2f} |")
            lines.append("")
    lines += ["## Verdicts", ""]
    lines += [f"- ({k}) {v['text']}." for k, v in verdict.items()]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="capstone size, contexts 128 and 1024: a smoke test")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per point (default 7; --quick 3)")
    parser.add_argument("--steps", type=int, default=None, help="steps per engine per round (default 3; --quick 2)")
    parser.add_argument("--note", default="", help="a sentence for the header (e.g. the conditions of a smoke run)")
    parser.add_argument("--out", type=Path, default=None,
                        help="markdown file (default for a full run: bench/results/decode-compare-cpu-<date>.md)")
    args = parser.parse_args(argv)
    import transformers

    start = time.perf_counter()
    load_start = os.getloadavg()[0]
    sizes = QUICK["sizes"] if args.quick else tuple(SIZES)
    contexts = QUICK["contexts"] if args.quick else CONTEXTS
    rounds = args.rounds or (3 if args.quick else 7)
    steps = args.steps or (2 if args.quick else 3)
    seconds, compile_seconds = measure(sizes, BATCHES, contexts, rounds, steps,
                                       log=lambda s: print(s, file=sys.stderr, flush=True))
    verdict = verdicts(seconds, contexts)
    today = dt.date.today().isoformat()
    meta = {"date": today, "cpu": cpu_name(), "isa": vector_isa(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "load_start": load_start,
            "load_end": os.getloadavg()[0], "wall_seconds": time.perf_counter() - start,
            "rounds": rounds, "steps": steps, "quick": args.quick, "note": args.note, "compile_seconds": compile_seconds,
            "compile_text": ", ".join(f"{k} {v:.0f} s" for k, v in compile_seconds.items()),
            "hf_intermediate_size": {n: hf_intermediate_size(SIZES[n]["d_ff"]) for n in seconds},
            "parameters": {n: parameter_counts(SIZES[n]) for n in seconds}}
    table = render(seconds, contexts, verdict, meta)
    print(table)
    out = args.out if args.out is not None else (None if args.quick else RESULTS / f"decode-compare-cpu-{today}.md")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(table)
        record = {"meta": meta, "engines": list(ENGINES), "sizes": {n: SIZES[n] for n in seconds},
                  "batches": list(BATCHES), "contexts": list(contexts),
                  "seconds_per_step": {n: {str(B): s for B, s in by_b.items()} for n, by_b in seconds.items()},
                  "tokens_per_second": {n: {str(B): {e: [B / x for x in s[e]] for e in ENGINES}
                                            for B, s in by_b.items()} for n, by_b in seconds.items()},
                  "verdicts": verdict}
        assert all(math.isfinite(x) for by_b in seconds.values() for s in by_b.values() for v in s.values()
                   for x in v)
        out.with_suffix(".json").write_text(json.dumps(record, indent=1))
        print(f"wrote {out} and {out.with_suffix('.json')}", file=sys.stderr)


if __name__ == "__main__":
    main()

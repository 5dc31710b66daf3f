"""``python -m attnlab.tools.bench.decode [RUN ...] [--tokens N] [--repeats R]``: ``attnlab sample``'s
generation timed with the KV cache and without (``--no-cache``), in one process, the two arms
alternated (which goes first flips every repeat), same seed; medians and the per-pair ratio range
-> reports/inference/sample_speed.json and .md.

Each RUN is a run dir or .ckpt file, optionally ``:TOKENS`` (default ``--tokens``). Both arms must
produce the same text (checked every repeat): the cache changes the cost, not the output.
``--stream CAPACITY:SINKS`` adds a third arm, rolling caches (``attnlab sample --stream``), in the
same alternation, for checkpoints whose positions can take them (rope, alibi, none); its text is
its own once the cache evicts.

The bench's decode section also holds transformers' ``generate()`` as a yardstick
(``transformers_section``): the same weights in GPT2LMHeadModel or LlamaForCausalLM, greedy with its
KV cache, beside attnlab's cached greedy decode, as a ratio of tokens/s within alternated repeats.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from attnlab.attention.latent import step_macs
from attnlab.data.tokens import load_tokenizer
from attnlab.inference.sample import resolve_checkpoint
from attnlab.interop.families import family_of, hf_config
from attnlab.interop.state_dicts import to_hf
from attnlab.model.gpt import GPT, GPTConfig
from attnlab.tools.bench.kernels import matmul_peak_gflops
from attnlab.tools.bench.timing import measure
from attnlab.training.checkpointing import load_model
from attnlab.util.cli import command_parser
from attnlab.util.errors import CheckpointError
from attnlab.util.files import atomic_write_text, git_sha
from attnlab.writing.markdown import markdown_table

OUT = Path("reports/inference")
SAMPLING = dict(temperature=0.8, top_k=40)  # attnlab sample's defaults


def time_generate(
    model, idx: torch.Tensor, tokens: int, seed: int, cache: bool, stream: tuple[int, int] | None = None
) -> tuple[float, list[int]]:
    """(seconds, generated ids) of one ``generate`` call with attnlab sample's sampling settings."""
    gen = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    out = model.generate(idx, tokens, generator=gen, cache=cache, stream=stream, **SAMPLING)
    return time.perf_counter() - t0, out[0].tolist()


def bench_run(
    ckpt: Path, tokens: int, repeats: int, prompt: str = "\n", seed: int = 0, stream: tuple[int, int] | None = None
) -> dict:
    """Alternated cached / uncached (/ rolling, with ``stream``) generations of ``tokens`` tokens
    from one checkpoint."""
    try:
        module = load_model(ckpt)[0].eval()
    except CheckpointError as err:
        raise SystemExit(f"attnlab: error: {err}; expected a checkpoint written by attnlab train") from None
    model, cfg = module.model, module.model.cfg
    if stream is not None and (model.wpe is not None or stream[0] > cfg.block_size):
        stream = None  # learned positions or too long a capacity: this checkpoint takes no rolling cache
    idx = torch.tensor([load_tokenizer(ckpt, module.hparams.get("vocab")).encode(prompt)], dtype=torch.long)
    arms = {"cached": dict(cache=True), "uncached": dict(cache=False)}
    if stream is not None:
        arms["stream"] = dict(cache=True, stream=stream)
    for arm in arms.values():  # warm-up: first-call allocations and lazy initialisation
        time_generate(model, idx, min(tokens, 16), seed, **arm)
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    identical = True
    for r in range(repeats):
        names = list(arms) if r % 2 == 0 else list(arms)[::-1]
        texts = {}
        for name in names:
            s, texts[name] = time_generate(model, idx, tokens, seed, **arms[name])
            seconds[name].append(s)
        identical &= texts["cached"] == texts["uncached"]
    ratios = [u / c for c, u in zip(seconds["cached"], seconds["uncached"])]
    median = {arm: statistics.median(v) for arm, v in seconds.items()}
    return {
        "stream": None if stream is None else {"capacity": stream[0], "sinks": stream[1]},
        "checkpoint": str(ckpt),
        "tokens": tokens,
        "prompt_tokens": idx.shape[1],
        "repeats": repeats,
        "seed": seed,
        "sampling": SAMPLING,
        "model": {
            "block_size": cfg.block_size,
            "n_layer": cfg.n_layer,
            "n_head": cfg.n_head,
            "n_kv_head": cfg.n_kv_head,
            "d_model": cfg.d_model,
            "pos_encoding": cfg.pos_encoding,
            "backend": cfg.attention.backend,
            "escape": cfg.attention.escape,
        },
        # steps whose window passes block_size refill the caches from the whole window (GPT.generate)
        "refilled_steps": max(0, idx.shape[1] + tokens - cfg.block_size),
        "seconds": seconds,
        "median_s": median,
        "tokens_per_s": {arm: tokens / s for arm, s in median.items()},
        "speedup": median["uncached"] / median["cached"],
        "speedup_range": [min(ratios), max(ratios)],
        **({"stream_speedup": median["uncached"] / median["stream"]} if stream is not None else {}),
        "identical_text": identical,
    }


# ---- the decode section of ``python -m attnlab.tools.bench`` (make bench) ------------------------------------

# the tiny preset's shape (4 layers, 4 heads, d_model 128, d_k 32), rope, sdpa; random weights: the cost
# of a decoding step and the bytes a cache holds do not depend on what the weights learned
DECODE = {
    "full": dict(contexts=(256, 512, 1024, 2048), new_tokens=32, repeats=5, batches=(1, 4, 16)),
    "fast": dict(contexts=(128, 1024), new_tokens=16, repeats=3, batches=(1, 4, 16)),
    "tiny": dict(
        contexts=(16, 32), new_tokens=4, repeats=2, batches=(1, 4), shape=dict(n_layer=2, n_head=4, d_model=32)
    ),
}
DECODE_SHAPE = dict(n_layer=4, n_head=4, d_model=128, vocab_size=65)
BUDGET_BYTES = 2**30  # the stated memory budget of the concurrency ceiling (1 GiB)


def decode_variants(n_head: int, d_k: int) -> dict[str, dict]:
    """GPTConfig changes per variant: the key/value heads (multi-head, grouped, multi-query), latent
    attention with a latent of 4 d_k (DeepSeek-V2's d_c, a cache about GQA's with 2.25 groups at 4
    heads) and of 2 d_k, each with a RoPE key of d_k / 2, decoded absorbed (the caches' ``auto``:
    a prefill expands, a step absorbs) and re-expanded (``_expanded``; ``latent_decode``, the caches'
    setting, attention/latent.py), the escape slot on multi-head, and sigmoid attention, which only
    the explicit kernel runs: beside it softmax on that same kernel (``softmax_scaled``), the
    reference its own cost is read against."""
    mla_4dk = {"attention": {"latent": {"d_c": 4 * d_k, "d_rope": d_k // 2}}}
    mla_2dk = {"attention": {"latent": {"d_c": 2 * d_k, "d_rope": d_k // 2}}}
    return {
        "mha": {},
        "gqa": {"n_kv_head": n_head // 2},
        "mqa": {"n_kv_head": 1},
        "mla_4dk": mla_4dk,
        "mla_4dk_expanded": {**mla_4dk, "latent_decode": "expanded"},
        "mla_2dk": mla_2dk,
        "mla_2dk_expanded": {**mla_2dk, "latent_decode": "expanded"},
        "escape_zero_logit": {"attention": {"escape": "zero_logit"}},
        "escape_learned": {"attention": {"escape": "learned"}},
        "softmax_scaled": {"attention": {"backend": "scaled"}},
        "sigmoid": {"attention": {"backend": "scaled", "normalize": "sigmoid"}},
    }


def kv_bytes_per_token(caches) -> tuple[float, float]:
    """(filled, allocated) bytes per cached position and sequence, summed over the layers, read from
    the cache tensors: the filled part of k and v (a latent layer's rows: k alone), and their whole
    storage over its room."""
    filled = allocated = 0.0
    for c in caches:
        b = c.k.shape[0]
        for t in (c.k, c.v) if c.v is not None else (c.k,):
            filled += t[:, :, : c.length].numel() * t.element_size() / (b * c.length)
            allocated += t.numel() * t.element_size() / (b * t.shape[2])
    return filled, allocated


@torch.no_grad()
def _decode(model, caches, last: torch.Tensor, steps: int) -> float:
    """Seconds of ``steps`` greedy decoding steps after ``last`` (B, 1)."""
    _sync(last.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        last = model.next_logits(last, caches).argmax(-1, keepdim=True)
    _sync(last.device)
    return time.perf_counter() - t0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":  # kernels run asynchronously: time what they did, not their launch
        torch.cuda.synchronize(device)


def _rewind(caches, length: int) -> None:
    for c in caches:  # the entries past ``length`` are overwritten by the next steps
        c.length = length


def _spread(values: list[float]) -> list[float]:
    return [min(values), max(values)]


def decode_section(
    contexts: tuple[int, ...],
    new_tokens: int,
    repeats: int,
    batches: tuple[int, ...],
    shape: dict | None = None,
    budget_bytes: int = BUDGET_BYTES,
    backend: str = "sdpa",
    device: torch.device | str = "cpu",
    log=print,
) -> dict:
    """Per variant and context T: prefill seconds, ms per decoded token, KV bytes per token (measured
    and 2 x layers x n_kv_head x d_k x element size; layers x (d_c + d_rope) x element size with a latent), the concurrency ceiling at ``budget_bytes``
    and the tokens/s of B sequences decoded as one batch. Variants alternate within every repeat (the
    order flips each repeat) and each speed ratio against multi-head attention is taken within a repeat."""

    dims = {**DECODE_SHAPE, **(shape or {})}
    block = max(contexts) + new_tokens
    load_before = os.getloadavg()[0]
    models, refused, modes = {}, {}, {}
    yardsticks = roofline_yardsticks(device)
    for name, change in decode_variants(dims["n_head"], dims["d_model"] // dims["n_head"]).items():
        change = dict(change)
        modes[name] = change.pop("latent_decode", "auto")
        attention = {"backend": backend, **change.pop("attention", {})}
        torch.manual_seed(0)
        try:
            model = (
                GPT(GPTConfig(block_size=block, pos_encoding="rope", attention=attention, **dims, **change))
                .to(device)
                .eval()
            )
        except (ValueError, TypeError) as err:  # a variant this attnlab cannot build
            refused[name] = f"{type(err).__name__}: {str(err).splitlines()[0]}"
            continue
        models[name] = model
    names = list(models)
    rows = []
    for T in contexts:
        ids = torch.randint(
            0, dims["vocab_size"], (max(batches), T + 1), generator=torch.Generator().manual_seed(T)
        ).to(device)
        per = {n: {"prefill_s": [], "decode_s": [], "tput": {b: [] for b in batches}} for n in names}
        load_at_T = os.getloadavg()[0]
        # batch 1 measures the latency (prefill, ms a token) and the cache bytes whatever ``batches`` holds;
        # the others give throughput alone
        for b in dict.fromkeys((1, *batches)):
            caches = {}
            with torch.no_grad():
                for n in names:  # warm-up and the prefill the repeats rewind to
                    caches[n] = models[n].kv_caches(modes[n])
                    models[n].next_logits(ids[:b, :T], caches[n])
                    _decode(models[n], caches[n], ids[:b, T:], 2)
            for r in range(repeats):
                for n in names if r % 2 == 0 else names[::-1]:
                    model, cs = models[n], caches[n]
                    if b == 1:
                        _rewind(cs, 0)
                        _sync(ids.device)
                        t0 = time.perf_counter()
                        with torch.no_grad():
                            model.next_logits(ids[:1, :T], cs)
                        _sync(ids.device)
                        per[n]["prefill_s"].append(time.perf_counter() - t0)
                    _rewind(cs, T)
                    s = _decode(model, cs, ids[:b, T:], new_tokens)
                    if b in per[n]["tput"]:
                        per[n]["tput"][b].append(b * new_tokens / s)
                    if b == 1:
                        per[n]["decode_s"].append(s)
            if b == 1:
                measured = {n: kv_bytes_per_token((_rewind(caches[n], T), caches[n])[1]) for n in names}
                paths = {n: models[n].blocks[0].attn.latent_path for n in names}
            del caches
        for n in names:
            cfg, model = models[n].cfg, models[n]
            elem = next(model.parameters()).element_size()
            weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
            filled, allocated = measured[n]
            formula = cfg.kv_cache_bytes(T, elem) / T  # bytes per token of context; no variant here has a window
            p, base = per[n], per["mha"] if "mha" in per else per[n]
            ms = [1e3 * s / new_tokens for s in p["decode_s"]]
            ms_ratio = [a / m for a, m in zip(p["decode_s"], base["decode_s"])]
            row = {
                "variant": n,
                "backend": cfg.attention.backend,
                "T": T,
                "n_head": cfg.n_head,
                "n_kv_head": cfg.n_kv_head,
                "n_layer": cfg.n_layer,
                "d_k": cfg.d_k,
                "latent_d_c": cfg.attention.latent.d_c,
                "latent_d_rope": cfg.attention.latent.d_rope,
                "element_size": elem,
                "escape": cfg.attention.escape,
                "latent_decode": modes[n] if cfg.attention.latent.d_c is not None else None,
                "latent_path": paths[n],  # the form the decoding steps took (layer 0, the last step)
                "load_avg_1m": load_at_T,
                "prefill_s": statistics.median(p["prefill_s"]),
                "prefill_s_range": _spread(p["prefill_s"]),
                "ms_per_token": statistics.median(ms),
                "ms_per_token_range": _spread(ms),
                "decode_s": p["decode_s"],
                "ms_per_token_ratio_to_mha": statistics.median(ms_ratio),
                "ms_per_token_ratio_range": _spread(ms_ratio),
                "kv_bytes_per_token": filled,
                "kv_bytes_per_token_allocated": allocated,
                "kv_bytes_per_token_formula": formula,
                "kv_bytes_match": filled == formula == allocated,
                "weights_bytes": weights,
                "budget_bytes": budget_bytes,
                "max_sequences": max(0, int((budget_bytes - weights) // (filled * T))),
                "throughput": {},
            }
            for b in batches:
                ratio = [a / m for a, m in zip(p["tput"][b], base["tput"][b])]
                row["throughput"][str(b)] = {
                    "tokens_per_s": statistics.median(p["tput"][b]),
                    "per_repeat": p["tput"][b],
                    "range": _spread(p["tput"][b]),
                    "ratio_to_mha": statistics.median(ratio),
                    "ratio_range": _spread(ratio),
                    **decode_costs(model, T, b, paths[n], yardsticks),
                }
            rows.append(row)
        mha = next((r for r in rows if r["T"] == T and r["variant"] == "mha"), None)
        for r in rows:
            if r["T"] == T and mha is not None:
                r["kv_bytes_ratio_to_mha"] = r["kv_bytes_per_token"] / mha["kv_bytes_per_token"]
                r["max_sequences_ratio_to_mha"] = r["max_sequences"] / max(mha["max_sequences"], 1)
        log(
            f"  decode T={T}: "
            + ", ".join(f"{r['variant']} {r['ms_per_token']:.2f} ms/token" for r in rows if r["T"] == T)
        )
    return {
        "setup": {
            **dims,
            "block_size": block,
            "pos_encoding": "rope",
            "backend": backend,
            "dtype": "float32",
            "device": str(device),
            "contexts": list(contexts),
            "new_tokens": new_tokens,
            "repeats": repeats,
            "batches": list(batches),
            "budget_bytes": budget_bytes,
            "threads": torch.get_num_threads(),
            "load_avg_1m": [load_before, os.getloadavg()[0]],
            "yardsticks": yardsticks,
        },
        "rows": rows,
        "refused": refused,
    }


# ---- the roofline of a decoding step: what a token must read and compute, against this machine's rates -----


def read_bandwidth(device: torch.device | str, mib: int = 256, repeats: int = 5) -> float:
    """Bytes/s of reading a ``mib`` MiB float32 tensor once (a sum), median of ``repeats``: the rate
    at which a step streams a cache larger than the CPU's caches."""
    x = torch.ones(mib * 2**20 // 4, device=device)
    seconds = measure(lambda: x.sum(), torch.device(device), repeats=repeats, warmup=1)
    return x.numel() * 4 / statistics.median(seconds)


def roofline_yardsticks(device: torch.device | str) -> dict:
    """This machine's read bandwidth and matmul rate, measured at the start of the decode section."""
    n = 1024 if torch.device(device).type == "cpu" else 4096
    mm = matmul_peak_gflops(torch.device(device), torch.float32, n, repeats=5)
    return {"read_gb_per_s": read_bandwidth(device) / 1e9, "matmul_gflops": mm["median"], "matmul_n": n}


def _numel(*tensors) -> int:
    return sum(t.numel() for t in tensors if t is not None)


@torch.no_grad()
def decode_costs(model, context: int, batch: int, path: str | None, yardsticks: dict) -> dict:
    """What one decoded token costs at ``context`` cached positions, ``batch`` sequences a step,
    every layer summed: bytes read (the weights a step uses, over the batch, and the sequence's
    cache; re-expanded latent attention also reads the keys and values it expands), multiply-adds
    (one per weight used, and the attention's: ``latent.step_macs`` for latent attention, whose
    absorbed query and output maps are the folded weights), and the roofline time: the larger of
    bytes / read bandwidth and 2 x multiply-adds / matmul rate."""
    cfg, elem = model.cfg, next(model.parameters()).element_size()
    h, d, t = cfg.n_head, cfg.d_k, context
    weights = attention_macs = extra_bytes = 0
    for block in model.blocks:
        attn = block.attn
        weights += _numel(block.mlp.fc.weight, block.mlp.proj.weight) if block.mlp is not None else 0
        weights += _numel(attn.gate_proj.weight if attn.gate_proj is not None else None)
        lat = attn.latent
        if lat is None:
            weights += _numel(attn.qkv_proj.weight, attn.out_proj.weight)
            attention_macs += t * h * 2 * d
        elif path == "absorbed":
            w_in, _, w_out = attn.absorbed_weights()
            q_up = attn.q_up is not None  # with a query latent, qkv_proj still reads x and q_up's weight is folded
            weights += _numel(w_in, w_out, attn.qkv_proj.weight if q_up else None)
            attention_macs += t * h * 2 * (lat.d_c + lat.d_rope)
        else:
            weights += _numel(attn.qkv_proj.weight, attn.out_proj.weight, attn.kv_up.weight)
            weights += _numel(attn.q_up.weight if attn.q_up is not None else None)
            attention_macs += step_macs(1, t, h, d, lat.d_c, lat.d_rope)["expanded"]
            extra_bytes += t * h * (2 * d + lat.d_rope) * elem  # the expanded keys and values, read by the kernel
    weights += model.lm_head.weight.numel()
    cache_bytes = cfg.kv_cache_bytes(t, elem)
    read = weights * elem / batch + cache_bytes + extra_bytes
    macs = weights + attention_macs
    bytes_s = read / (yardsticks["read_gb_per_s"] * 1e9)
    macs_s = 2 * macs / (yardsticks["matmul_gflops"] * 1e9)
    return {
        "bytes_read_per_token": read,
        "macs_per_token": macs,
        "roofline_s_per_token": max(bytes_s, macs_s),
        "bound": "bytes" if bytes_s >= macs_s else "multiply-adds",
    }


# transformers' generate() beside attnlab's cached decode: the tiny preset's shape and GPT-2 124M's,
# with the GPT-2 block (learned positions, projection biases, tanh GELU) so both load GPT-2's weights
HF_SHAPES = {
    "tiny": dict(n_layer=4, n_head=4, d_model=128, vocab_size=65, block_size=256),
    "gpt2_124m": dict(n_layer=12, n_head=12, d_model=768, vocab_size=50257, block_size=1024),
    "micro": dict(n_layer=2, n_head=4, d_model=32, vocab_size=61, block_size=32),
}
GPT2_BLOCK = dict(pos_encoding="learned", bias=True, mlp="gelu_tanh")
DECODE_HF = {
    "full": dict(shapes=("tiny", "gpt2_124m"), prompt=64, new_tokens=64, repeats=7, batches=(1, 8)),
    "fast": dict(shapes=("tiny",), prompt=32, new_tokens=32, repeats=3, batches=(1, 8)),
    "tiny": dict(shapes=("micro",), prompt=4, new_tokens=6, repeats=2, batches=(1, 2)),
}


@torch.no_grad()
def attnlab_greedy(model, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """(B, T + new_tokens): the prompt prefilled into fresh caches, then one argmax token per step."""
    caches = model.kv_caches()
    last = model.next_logits(prompt, caches).argmax(-1, keepdim=True)
    out = [prompt, last]
    for _ in range(new_tokens - 1):
        last = model.next_logits(last, caches).argmax(-1, keepdim=True)
        out.append(last)
    return torch.cat(out, dim=1)


@torch.no_grad()
def transformers_greedy(hf_model, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """transformers' greedy ``generate`` with its KV cache; every step runs (no end-of-text stop)."""
    return hf_model.generate(
        prompt,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        use_cache=True,
        pad_token_id=0,
        eos_token_id=None,
        attention_mask=torch.ones_like(prompt),
    )


def transformers_twin(model):
    """transformers' model (GPT2LMHeadModel or LlamaForCausalLM) holding ``model``'s weights."""
    import transformers

    config = asdict(model.cfg)
    kwargs, family = hf_config(config), family_of(config)
    kwargs.pop("model_type")
    hf_cls = {"gpt2": transformers.GPT2Config, "llama": transformers.LlamaConfig}[family]
    hf_model = transformers.AutoModelForCausalLM.from_config(hf_cls(**kwargs))
    hf_model.load_state_dict(to_hf(family, model.state_dict(), model.cfg), strict=False)
    if model.cfg.tie_embeddings:
        hf_model.tie_weights()
    return hf_model.to(next(model.parameters()).device).eval()


# float32 rounding: the two compute the same sums in different orders (Linear against Conv1D)
LOGITS_TOLERANCE = dict(atol=2e-5, rtol=1e-5)


@torch.no_grad()
def same_logits(model, hf_model, ids: torch.Tensor) -> tuple[float, bool]:
    """(largest |difference|, equal within LOGITS_TOLERANCE) of the two models' logits at every
    position of ``ids``: the weights copied into transformers compute attnlab's function."""
    ours, theirs = model(ids)[0], hf_model(ids).logits
    return (ours - theirs).abs().max().item(), torch.allclose(ours, theirs, **LOGITS_TOLERANCE)


def transformers_section(
    shapes: tuple[str, ...],
    prompt: int,
    new_tokens: int,
    repeats: int,
    batches: tuple[int, ...],
    device: torch.device | str = "cpu",
    log=print,
) -> dict:
    """Per shape and batch: tokens/s of attnlab's cached greedy decode and of transformers'
    ``generate()`` on the same weights (a random GPT-2-block model), the prompt's prefill included
    in both; the two arms alternate within every repeat (which goes first flips) and the ratio
    attnlab / transformers is taken within a repeat. The tokens both produce are compared."""

    load_before = os.getloadavg()[0]
    rows = []
    for name in shapes:
        dims = HF_SHAPES[name]
        torch.manual_seed(0)
        model = GPT(GPTConfig(**dims, **GPT2_BLOCK, attention={"backend": "sdpa"})).to(device).eval()
        hf_model = transformers_twin(model)
        for b in batches:
            ids = torch.randint(0, dims["vocab_size"], (b, prompt), generator=torch.Generator().manual_seed(b))
            ids = ids.to(device)
            arms = {"attnlab": (attnlab_greedy, model), "transformers": (transformers_greedy, hf_model)}
            outputs = {arm: run(m, ids, new_tokens) for arm, (run, m) in arms.items()}  # warm-up; the tokens compared
            logit_diff, logits_equal = same_logits(model, hf_model, outputs["attnlab"])
            seconds: dict[str, list[float]] = {arm: [] for arm in arms}
            for r in range(repeats):
                for arm in list(arms) if r % 2 == 0 else list(arms)[::-1]:
                    _sync(ids.device)
                    t0 = time.perf_counter()
                    run, m = arms[arm]
                    run(m, ids, new_tokens)
                    _sync(ids.device)
                    seconds[arm].append(time.perf_counter() - t0)
            tps = {arm: [b * new_tokens / s for s in v] for arm, v in seconds.items()}
            ratios = [a / t for a, t in zip(tps["attnlab"], tps["transformers"])]
            rows.append(
                {
                    "shape": name,
                    **dims,
                    "batch": b,
                    "seconds": seconds,
                    "tokens_per_s": {arm: statistics.median(v) for arm, v in tps.items()},
                    "tokens_per_s_range": {arm: _spread(v) for arm, v in tps.items()},
                    "ratio": statistics.median(ratios),
                    "ratio_range": _spread(ratios),
                    "identical_tokens": torch.equal(outputs["attnlab"], outputs["transformers"]),
                    "max_logit_diff": logit_diff,
                    "logits_equal": logits_equal,
                }
            )
            log(f"  transformers {name} B={b}: attnlab / generate() tokens/s {rows[-1]['ratio']:.2f}")
    import transformers

    return {
        "setup": {
            "block": "gpt2 (learned positions, biases, tanh GELU), sdpa, random weights",
            "prompt": prompt,
            "new_tokens": new_tokens,
            "repeats": repeats,
            "batches": list(batches),
            "device": str(device),
            "transformers": transformers.__version__,
            "logits_tolerance": LOGITS_TOLERANCE,
            "threads": torch.get_num_threads(),
            "load_avg_1m": [load_before, os.getloadavg()[0]],
        },
        "rows": rows,
    }


def transformers_table(section: dict) -> list[str]:
    """bench.md's transformers rows."""

    s = section["setup"]
    body = [
        [
            r["shape"],
            f"{r['n_layer']}x{r['d_model']}",
            r["batch"],
            *(
                f"{r['tokens_per_s'][arm]:.1f}"
                + (" ({:.1f}-{:.1f})".format(*r["tokens_per_s_range"][arm]) if "tokens_per_s_range" in r else "")
                for arm in ("attnlab", "transformers")
            ),
            f"{r['ratio']:.2f} ({r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f})",
            "yes" if r["identical_tokens"] else "no",
            f"{'yes' if r['logits_equal'] else 'no'} ({r['max_logit_diff']:.1e})" if "logits_equal" in r else "-",
        ]
        for r in section["rows"]
    ]
    header = [
        "shape",
        "layers x d_model",
        "B",
        "attnlab tok/s (min-max)",
        "generate() tok/s (min-max)",
        "ratio (min-max)",
        "same tokens",
        "same logits (max diff)",
    ]
    return [
        f"transformers {s['transformers']} generate() (greedy, its KV cache) beside attnlab's cached greedy decode on "
        f"the same weights ({s['block']}): a {s['prompt']}-token prompt and {s['new_tokens']} new tokens per sequence, "
        f"prefill included; {s['repeats']} repeats, arms alternated, ratio attnlab / transformers within a repeat, "
        f"medians; logits compared at every position of the decoded sequences ({_tolerance(s)}); "
        f"{s['device']}, {s['threads']} torch thread(s)"
        + (
            f", load average {s['load_avg_1m'][0]:.1f} before and {s['load_avg_1m'][1]:.1f} after (a shared machine)."
            if s.get("load_avg_1m")
            else "."
        ),
        "",
        *markdown_table(header, body, align="lrrrrrll").splitlines(),
    ]


def _tolerance(setup: dict) -> str:
    tol = setup.get("logits_tolerance")
    return "float32 rounding" if tol is None else f"equal within atol {tol['atol']:g}, rtol {tol['rtol']:g}"


def decode_table(section: dict) -> list[str]:
    """bench.md's decode section."""

    s = section["setup"]
    batches = [str(b) for b in s["batches"]]
    header = [
        "variant",
        "T",
        "cached values per position and layer",
        "prefill ms",
        "ms/token (min-max)",
        "ms/token / mha's (min-max)",
        "KV B/token (formula)",
        "KV / mha's",
        f"sequences in {s['budget_bytes'] / 2**30:g} GiB",
        *[f"B={b} tok/s (/ mha's, min-max)" for b in batches],
    ]
    body = []
    for r in section["rows"]:
        tp = r["throughput"]
        body.append(
            [
                r["variant"],
                r["T"],
                f"2 x {r['n_kv_head']} x {r['d_k']}"
                if r["latent_d_c"] is None
                else f"{r['latent_d_c']} + {r['latent_d_rope']} (latent, RoPE key)"
                + (f", {FORMS.get(r['latent_path'], r['latent_path'])}" if r.get("latent_path") else ""),
                f"{1e3 * r['prefill_s']:.1f}",
                f"{r['ms_per_token']:.2f} ({r['ms_per_token_range'][0]:.2f}-{r['ms_per_token_range'][1]:.2f})",
                f"{r['ms_per_token_ratio_to_mha']:.2f} ({r['ms_per_token_ratio_range'][0]:.2f}-"
                f"{r['ms_per_token_ratio_range'][1]:.2f})",
                f"{r['kv_bytes_per_token']:.0f} ({r['kv_bytes_per_token_formula']:.0f})",
                f"{r.get('kv_bytes_ratio_to_mha', float('nan')):.2f}",
                r["max_sequences"],
                *[
                    f"{tp[b]['tokens_per_s']:.0f} ({tp[b]['ratio_to_mha']:.2f}, {tp[b]['ratio_range'][0]:.2f}-"
                    f"{tp[b]['ratio_range'][1]:.2f})"
                    for b in batches
                ],
            ]
        )
    lines = [
        f"{s.get('device', 'cpu')}: GPT of {s['n_layer']} layers, {s['n_head']} heads, d_model {s['d_model']}, rope, {s['backend']}, {s['dtype']}, "
        f"random weights, batch 1 unless B says otherwise. Per context T: prefill = one forward of T tokens into empty "
        f"caches; ms/token = {s['new_tokens']} greedy steps after the T-token prefill, over {s['new_tokens']}; "
        f"KV B/token = the filled k and v of every layer's cache over its positions (formula 2 x layers x n_kv_head x "
        f"d_k x element size; mla: layers x (d_c + d_rope) x element size, the latent and the RoPE key); sequences = (budget - weights) // (KV B/token x T), vLLM's count; B=b tok/s = b "
        f"sequences of T decoded as one batch, b x {s['new_tokens']} tokens over the time. {s['repeats']} repeats, "
        f"variants alternated (the order flips every repeat), medians; ratios to mha within a repeat. "
        f"{s['threads']} torch thread(s)"
        + (
            f", load average {s['load_avg_1m'][0]:.1f} before and {s['load_avg_1m'][1]:.1f} after (a shared machine)."
            if s.get("load_avg_1m")
            else "."
        ),
        "",
        *markdown_table(header, body, align="lrlrrrrrr" + "r" * len(batches)).splitlines(),
    ]
    explicit = sorted({r["variant"] for r in section["rows"] if r.get("backend", s["backend"]) != s["backend"]})
    if explicit:
        lines += [
            "",
            f"{' and '.join(explicit)} run the explicit kernel: sigmoid's cost reads against softmax_scaled's.",
        ]
    if section.get("refused"):
        lines += ["", "Refused: " + "; ".join(f"{n}: {why}" for n, why in section["refused"].items())]
    if any(r.get("latent_path") == "absorbed" for r in section["rows"]):
        lines += ["", *latent_goal_table(section)]
    if section.get("transformers"):
        lines += ["", *transformers_table(section["transformers"])]
    return lines


FORMS = {"absorbed": "absorbed", "expanded": "re-expanded"}


def latent_goal(T: int, batch: int) -> float:
    """Absorbed latent attention's goal in tokens/s against multi-head's: at least 1.0x
    at T >= 1024 for B 1 and 16, at least 0.8x at every other row."""
    return 1.0 if T >= 1024 and batch in (1, 16) else 0.8


def _per(row: dict, mha: dict, b: str, key: str) -> float:
    return row["throughput"][b][key] / mha["throughput"][b][key]


def shortfall(row: dict, mha: dict, b: str, setup: dict) -> str:
    """Why a row's tokens/s ratio falls short of its goal, in roofline terms, from the row's data."""
    tp, base, y = row["throughput"][b], mha["throughput"][b], setup["yardsticks"]
    ms, roof = 1e3 / tp["tokens_per_s"], 1e3 * tp["roofline_s_per_token"]
    mha_ms, mha_roof = 1e3 / base["tokens_per_s"], 1e3 * base["roofline_s_per_token"]
    above = ms - roof - (mha_ms - mha_roof)
    return (
        f"{row['variant']} at T {row['T']}, B {b}: {tp['ratio_to_mha']:.2f}x against a goal of "
        f"{latent_goal(row['T'], int(b)):.1f}x. A token reads {tp['bytes_read_per_token'] / 1e3:.0f} kB "
        f"({_per(row, mha, b, 'bytes_read_per_token'):.2f}x mha's) and does {tp['macs_per_token'] / 1e6:.2f} M "
        f"multiply-adds ({_per(row, mha, b, 'macs_per_token'):.2f}x); at {y['read_gb_per_s']:.1f} GB/s and "
        f"{y['matmul_gflops']:.0f} GFLOP/s the roofline gives "
        f"{base['roofline_s_per_token'] / tp['roofline_s_per_token']:.2f}x ({tp['bound']}-bound). Measured, a "
        f"token takes {ms:.3f} ms against a roofline of {roof:.3f} ms (mha {mha_ms:.3f} against {mha_roof:.3f}): "
        f"{100 * (1 - roof / ms):.0f} % of its time lies above the roofline (per-operation overhead, and "
        f"kernels below the yardsticks' rates), {abs(above):.3f} ms a token {'more' if above > 0 else 'less'} than "
        "mha's. The times are each arm's median tokens/s; the ratio is the median of the alternated repeats' own "
        "ratios, so the two can disagree where the repeats vary."
    )


def latent_goal_table(section: dict) -> list[str]:
    """Latent attention's rows against the goal, per T and B, with the roofline of each: bytes read
    and multiply-adds per token beside multi-head attention's and, for an absorbed row short of its
    goal, why (``shortfall``)."""
    s = section["setup"]
    mha = {r["T"]: r for r in section["rows"] if r["variant"] == "mha"}
    body, short = [], []
    for r in (r for r in section["rows"] if r.get("latent_path")):
        for b in map(str, s["batches"]):
            tp, goal, base = r["throughput"][b], latent_goal(r["T"], int(b)), mha[r["T"]]
            absorbed = r["latent_path"] == "absorbed"
            met = tp["ratio_to_mha"] >= goal
            if absorbed and not met:
                short.append(shortfall(r, base, b, s))
            body.append(
                [
                    r["variant"],
                    FORMS.get(r["latent_path"], r["latent_path"]),
                    r["T"],
                    b,
                    f"{tp['ratio_to_mha']:.2f} ({tp['ratio_range'][0]:.2f}-{tp['ratio_range'][1]:.2f})",
                    f"{goal:.1f}" if absorbed else "-",
                    ("yes" if met else "**no**") if absorbed else "-",
                    f"{r['kv_bytes_ratio_to_mha']:.2f}",
                    f"{_per(r, base, b, 'bytes_read_per_token'):.2f}",
                    f"{_per(r, base, b, 'macs_per_token'):.2f}",
                    f"{base['throughput'][b]['roofline_s_per_token'] / tp['roofline_s_per_token']:.2f} ({tp['bound']})",
                    f"{1e3 / tp['tokens_per_s']:.3f} / {1e3 * tp['roofline_s_per_token']:.3f}",
                ]
            )
    header = [
        "variant",
        "form",
        "T",
        "B",
        "tok/s / mha's (min-max)",
        "goal",
        "met",
        "KV B/token / mha's",
        "bytes read/token / mha's",
        "multiply-adds/token / mha's",
        "roofline tok/s / mha's (bound)",
        "ms/token measured / roofline",
    ]
    y = s["yardsticks"]
    lines = [
        "Latent attention against its goal (absorbed: at least 1.0x multi-head's tokens/s at T >= 1024 for B 1 "
        "and 16, at least 0.8x elsewhere), from the rows above. Bytes read per token: the weights a step uses over "
        "the batch, the sequence's cache and, re-expanded, the keys and values it expands; multiply-adds per token: "
        "one per weight used plus the attention's (absorbed: T x H x 2 (d_c + d_rope); re-expanded: "
        "T x d_c x 2 H d_k + T x H (2 d_k + d_rope)); roofline = the larger of bytes / read bandwidth and "
        f"2 x multiply-adds / matmul rate, at this run's {y['read_gb_per_s']:.1f} GB/s (a 256 MiB sum) and "
        f"{y['matmul_gflops']:.0f} GFLOP/s (a {y['matmul_n']}x{y['matmul_n']} matmul).",
        "",
        *markdown_table(header, body, align="llrrrlrrrrrr").splitlines(),
    ]
    if short:
        lines += ["", "Where an absorbed row falls short:", "", *(f"- {why}" for why in short)]
    return lines


def machine() -> dict:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load_avg_1m": os.getloadavg()[0],
    }


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        "# attnlab sample: KV cache against --no-cache",
        "",
        f"`python -m attnlab.tools.bench.decode` at git {report['git']}, {report['date']}. {m['cpus']}-core CPU "
        f"({m['processor']}), torch {m['torch']}, {m['torch_threads']} torch thread(s), load {m['load_avg_1m']:.1f} "
        "(a shared machine: other processes ran beside this one).",
        "Both arms in one process, alternated (the first arm flips every repeat), one prompt token (`\\n`), "
        f"temperature {SAMPLING['temperature']}, top-k {SAMPLING['top_k']}, the same seed: the two texts are "
        "compared every repeat.",
        "",
        "| checkpoint | block | layers x d_model | positions | tokens | refilled steps | cached s (tok/s) "
        "| no cache s (tok/s) | speed-up (pair range) | same text | rolling cache s (tok/s), speed-up |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["runs"]:
        cfg, med, tps = row["model"], row["median_s"], row["tokens_per_s"]
        lo, hi = row["speedup_range"]
        rolling = (
            "-"
            if row["stream"] is None
            else (
                f"{row['stream']['capacity']}:{row['stream']['sinks']}: {med['stream']:.3f} ({tps['stream']:.0f}), "
                f"{row['stream_speedup']:.2f}x"
            )
        )
        lines.append(
            f"| `{row['checkpoint']}` | {cfg['block_size']} | {cfg['n_layer']} x {cfg['d_model']} | {cfg['pos_encoding']} "
            f"| {row['tokens']} | {row['refilled_steps']} | {med['cached']:.3f} ({tps['cached']:.0f}) | {med['uncached']:.3f} "
            f"({tps['uncached']:.0f}) | {row['speedup']:.2f}x ({lo:.2f}-{hi:.2f}) | {'yes' if row['identical_text'] else 'NO'} "
            f"| {rolling} |"
        )
    lines += [
        "",
        "Medians of the repeats; the range is of the per-repeat ratios (no cache / cached). A refilled step is "
        "one whose window would pass block_size: the caches are then refilled from the whole window, which "
        "costs what the uncached step costs (docs/inference.md), so a checkpoint with a short block gains "
        "little on a long sample. The rolling cache (capacity:sinks, the first sinks tokens and the most recent "
        "ones) never refills; its speed-up is against no cache, and its text is its own once it evicts.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("bench.decode", __doc__.splitlines()[0])
    parser.add_argument(
        "runs", nargs="*", help="run dirs or .ckpt files, each optionally :TOKENS (default: the latest run)"
    )
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    parser.add_argument("--stream", metavar="CAPACITY:SINKS", help="also time rolling caches (rope, alibi, none)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    stream = None
    if args.stream is not None:
        capacity, _, sinks = args.stream.partition(":")
        if not (capacity.isdigit() and sinks.isdigit() and int(sinks) < int(capacity)):
            parser.error(f"--stream={args.stream!r}; expected CAPACITY:SINKS, integers with 0 <= SINKS < CAPACITY")
        stream = (int(capacity), int(sinks))
    if args.tokens < 1 or args.repeats < 1 or args.threads < 1:
        parser.error(
            f"--tokens, --repeats and --threads must be positive integers, got {args.tokens}, "
            f"{args.repeats}, {args.threads}"
        )
    torch.set_num_threads(args.threads)
    cases = []
    for spec in args.runs or [None]:
        run, _, tokens = (spec or "").partition(":")
        if tokens and not tokens.isdigit():
            parser.error(f"RUN={spec!r}: the part after ':' is a token count; expected a positive integer")
        cases.append((resolve_checkpoint(run or None), int(tokens) if tokens else args.tokens))
    rows = []
    for ckpt, tokens in cases:
        row = bench_run(ckpt, tokens, args.repeats, stream=stream)
        print(
            f"{ckpt}: {tokens} tokens, cached {row['median_s']['cached']:.3f} s, no cache "
            f"{row['median_s']['uncached']:.3f} s, speed-up {row['speedup']:.2f}x",
            file=sys.stderr,
        )
        rows.append(row)
    report = {
        "git": git_sha(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "runs": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "sample_speed.json", json.dumps(report, indent=1) + "\n")
    atomic_write_text(args.out / "sample_speed.md", markdown(report))
    print(f"wrote {args.out / 'sample_speed.md'}", file=sys.stderr)


if __name__ == "__main__":
    main()

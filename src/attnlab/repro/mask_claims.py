"""Claims 7 and 11: mask fill values x dtype x row type x kernel, measured on the installed torch.

The probabilities are read off every path the same way: v is the identity (d_v = T), so the
output row *is* the attention row, for explicit softmax and fused kernels alike.
Two ways of building a -1e9 mask are measured: ``-1e9`` (masked_fill with a Python scalar in the
logits' dtype, as both articles write it) and ``-1e9 cast`` (an additive mask built in fp32, then cast
to the logits' dtype: the common pattern, and the one where fp16 silently turns -1e9 into -inf).
Outcomes: ok (masked keys get 0, visible keys match a float64 reference), zeros (a fully masked
row returns 0: the clean result), uniform (equal weight on every key, masked ones included),
unmasked (weights as if there were no mask), leak / wrong, NaN, error (with its message).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnlab.repro.verdict import DETAIL, Check, Claim, Table

CAST = "-1e9 cast"  # -1e9 in an fp32 mask, cast to the logits' dtype
FILLS = ("-inf", "finfo.min", "-1e9", CAST, "-1e4")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
PATHS = ("explicit softmax", "SDPA math", "SDPA flash")
ROWS = ("partial", "full")
SAFE = {"ok", "zeros"}
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def fill_number(fill: str, dtype: torch.dtype) -> float:
    return torch.finfo(dtype).min if fill == "finfo.min" else -1e9 if fill == CAST else float(fill)


def cast_mask(allowed: torch.Tensor, dtype: torch.dtype, value: float = -1e9) -> torch.Tensor:
    """An additive mask built in fp32 and cast to ``dtype`` (where fp16 has no -1e9, the cast gives -inf)."""
    return torch.zeros(allowed.shape, dtype=torch.float32).masked_fill(~allowed, value).to(dtype)


def probe_inputs(t: int = 8, seed: int = 0):
    """q, k (1, 1, t, t) with logits of moderate size, v = identity; row 0 partly masked
    (keys 0..2 visible), row 1 fully masked, other rows causal."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, t, t, generator=g)
    k = torch.randn(1, 1, t, t, generator=g)
    allowed = torch.ones(t, t, dtype=torch.bool).tril()
    allowed[0, :3] = True
    allowed[1, :] = False
    return q, k, torch.eye(t)[None, None], allowed


def attention_rows(path: str, fill: str, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """The (t, t) attention rows a path produces, in fp32. Explicit softmax replaces masked logits by the fill
    (masked_fill, as both articles write it) or, for CAST, adds the cast fp32 mask; SDPA adds the fill as a
    float mask built in the same dtype (or the cast one)."""
    q, k, v, allowed = probe_inputs(seed=seed)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    scale = q.shape[-1] ** -0.5
    value = fill_number(fill, dtype)
    if path == "explicit softmax":
        scores = (q @ k.transpose(-2, -1)) * scale
        out = (scores + cast_mask(allowed, dtype) if fill == CAST else scores.masked_fill(~allowed, value)).softmax(-1)
    else:
        mask = (
            cast_mask(allowed, dtype)
            if fill == CAST
            else torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, value)
        )
        backend = SDPBackend.MATH if path == "SDPA math" else SDPBackend.FLASH_ATTENTION
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out[0, 0].float()


def bool_mask_rows(path: str, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """SDPA with a boolean mask (no fill value chosen by the user)."""
    q, k, v, allowed = probe_inputs(seed=seed)
    backend = SDPBackend.MATH if path == "SDPA math" else SDPBackend.FLASH_ATTENTION
    with sdpa_kernel([backend]):
        out = F.scaled_dot_product_attention(
            q.to(dtype), k.to(dtype), v.to(dtype), attn_mask=allowed, scale=q.shape[-1] ** -0.5
        )
    return out[0, 0].float()


def reference_rows(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float64 softmax over the visible keys only, the unmasked softmax, and the mask."""
    q, k, _, allowed = probe_inputs(seed=seed)
    scores = (q.double() @ k.double().transpose(-2, -1))[0, 0] * q.shape[-1] ** -0.5
    masked = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)
    return masked, torch.softmax(scores, -1), allowed


def row_outcome(
    row: torch.Tensor, visible: torch.Tensor, ref_masked: torch.Tensor, ref_unmasked: torch.Tensor, tol: float
) -> str:
    """Name what one attention row is (see the module docstring)."""
    row = row.double()
    if torch.isnan(row).any():
        return "NaN"
    if visible.any():
        if row[~visible].abs().max() > tol:
            return "leak"
        return "ok" if (row - ref_masked).abs().max() <= tol else "wrong"
    if row.abs().max() <= tol:
        return "zeros"
    if (row - 1.0 / row.numel()).abs().max() <= tol:
        return "uniform"
    if (row - ref_unmasked).abs().max() <= max(tol, 0.02):  # an additive fill rounds the logits a little
        return "unmasked"
    return "other"


def mask_grid(seed: int = 0) -> list[dict]:
    """Every fill x dtype x path x row -> outcome (and the error message for errors)."""
    ref_masked, ref_unmasked, allowed = reference_rows(seed)
    out = []
    for path in PATHS:
        for dname, dtype in DTYPES.items():
            for fill in FILLS + ("bool mask",):
                if fill == "bool mask" and path == "explicit softmax":
                    continue
                try:
                    rows = (
                        bool_mask_rows(path, dtype, seed)
                        if fill == "bool mask"
                        else attention_rows(path, fill, dtype, seed)
                    )
                except Exception as err:  # a refusal is a measured outcome, not a failure of the repro
                    msg = f"{type(err).__name__}: " + (str(err).strip().splitlines() or [""])[0]
                    out += [dict(path=path, dtype=dname, fill=fill, row=r, outcome="error", message=msg) for r in ROWS]
                    continue
                for r, i in (("partial", 0), ("full", 1)):
                    outcome = row_outcome(rows[i], allowed[i], ref_masked[i], ref_unmasked[i], TOL[dtype])
                    out.append({"path": path, "dtype": dname, "fill": fill, "row": r, "outcome": outcome})
    return out


def lookup(grid: list[dict], **key) -> str:
    return next(g["outcome"] for g in grid if all(g[k] == v for k, v in key.items()))


def safe_combinations(grid: list[dict], full_ok=SAFE) -> list[str]:
    """ "path / fill: dtypes" where the partial row is ok and the fully masked row's outcome is in ``full_ok``."""
    out = []
    for path in PATHS:
        for fill in FILLS + ("bool mask",):
            measured = [d for d in DTYPES if any((g["path"], g["fill"], g["dtype"]) == (path, fill, d) for g in grid)]
            dtypes = [
                d
                for d in measured
                if lookup(grid, path=path, dtype=d, fill=fill, row="partial") == "ok"
                and lookup(grid, path=path, dtype=d, fill=fill, row="full") in full_ok
            ]
            if dtypes:
                out.append(f"{path} / {fill}: {', '.join(dtypes)}")
    return out


def grid_tables(grid: list[dict]) -> list[Table]:
    tables = []
    for path in PATHS:
        fills = FILLS + (("bool mask",) if path != "explicit softmax" else ())
        rows = []
        for dname in DTYPES:
            for r in ROWS:
                rows.append([dname, r] + [lookup(grid, path=path, dtype=dname, fill=f, row=r) for f in fills])
        tables.append(
            Table(f"Mask outcomes, {path} (torch {torch.__version__}, CPU)", ["dtype", "row"] + list(fills), rows)
        )
    errors = sorted({(g["fill"], g["dtype"], g["message"]) for g in grid if g["outcome"] == "error"})
    if errors:
        tables[-1].note = "Errors: " + "; ".join(f"{f} in {d}: {m}" for f, d, m in errors)
    return tables


def claim_7(grid: list[dict]) -> Claim:
    fp16_1e9 = {p: lookup(grid, path=p, dtype="fp16", fill="-1e9", row="partial") for p in PATHS}
    cast_value = float(cast_mask(torch.tensor([False]), torch.float16)[0])  # what -1e9 becomes in the cast mask
    fp16_cast = {r: {p: lookup(grid, path=p, dtype="fp16", fill=CAST, row=r) for p in PATHS} for r in ROWS}
    inf_partial = [g["outcome"] for g in grid if g["fill"] == "-inf" and g["row"] == "partial"]
    inf_full = {p: lookup(grid, path=p, dtype="fp32", fill="-inf", row="full") for p in PATHS}
    overflow, inf_full_safe = (
        "-1e9 becomes -inf or NaN in fp16",
        all(g["outcome"] in SAFE for g in grid if g["fill"] == "-inf" and g["row"] == "full"),
    )
    checks = [
        Check(
            "minus-1e9-fp16",
            overflow,
            fp16_1e9,
            "-inf or NaN",
            "NaN" in fp16_1e9.values(),
            condition="masked_fill with a Python scalar",
        ),
        Check(
            "minus-1e9-fp16",
            overflow,
            cast_value,
            "-inf",
            math.isinf(cast_value) or "NaN" in fp16_cast["full"].values(),
            condition="an fp32 mask cast to fp16",
        ),
        Check(
            "minus-inf-partly-masked",
            "-inf is right for partly masked rows (paths x dtypes ok)",
            inf_partial.count("ok"),
            len(inf_partial),
            inf_partial.count("ok") == len(inf_partial),
        ),
        Check(
            "minus-inf-fully-masked",
            "-inf is safe for fully masked rows (fp32, per path)",
            inf_full,
            "ok or zeros",
            inf_full_safe,
            DETAIL,
        ),
    ]
    tables = grid_tables(grid)
    tables[0].note = (
        "Partial row: keys 0-2 visible. Full row: every key masked. Explicit softmax replaces masked logits by the fill "
        f"(masked_fill with a Python scalar); '{CAST}' adds -1e9 from a mask built in fp32 and cast to the dtype "
        f"(in fp16 it becomes {cast_value}); SDPA gets the fill as an additive float mask in the same dtype, or a boolean "
        "mask. Outcomes: ok (masked keys 0, visible keys as a float64 reference), zeros, uniform, unmasked, leak, wrong, "
        "NaN, error. Safe (partly masked row right, fully masked row zeros): "
        + "; ".join(safe_combinations(grid))
        + "."
    )
    return Claim(
        7,
        "-inf vs -1e9 masks: -1e9 overflows fp16; -inf is 'safe' in PyTorch (softmax handles -inf specially)",
        {"-1e9 in fp16": "overflows to -inf or NaN", "-inf": "safe"},
        {
            "fp16_-1e9": fp16_1e9,
            "fp16_-1e9_cast": fp16_cast,
            "cast_value_fp16": cast_value,
            "-inf_fully_masked_row_fp32": inf_full,
            "grid": grid,
        },
        checks,
        tables,
        method=f"Every fill x dtype x path x row type on torch {torch.__version__}, CPU; v is the identity, so the "
        "output row is the attention row.",
    )


def claim_11(grid: list[dict]) -> Claim:
    bf16 = {p: lookup(grid, path=p, dtype="bf16", fill="-1e9", row="full") for p in PATHS}
    nan_cases = sorted({f"{g['path']} / {g['dtype']} / {g['fill']}" for g in grid if g["outcome"] == "NaN"})
    table = Table(
        "Fully masked bf16 row with -1e9, and every combination of the grid that gives NaN",
        "case | outcome",
        [[f"bf16 / -1e9 / {p}", o] for p, o in bf16.items()] + [[c, "NaN"] for c in nan_cases],
        note="uniform: every logit of the row is the same -1e9, so after the max is subtracted each key gets exp(0) = 1 "
        "(equal weights, finite).",
    )
    explicit = bf16["explicit softmax"]
    return Claim(
        11,
        "-1e9 in BF16 with a fully masked row gives NaN, not 0",
        {"bf16 -1e9 fully masked row": "NaN"},
        {"bf16_-1e9_full_row": bf16, "nan_cases": nan_cases},
        [
            Check(
                "bf16-nan",
                "-1e9 in bf16, fully masked row, explicit softmax -> NaN",
                explicit,
                "NaN",
                explicit == "NaN",
            )
        ],
        [table],
        method="Read off claim 7's grid.",
    )

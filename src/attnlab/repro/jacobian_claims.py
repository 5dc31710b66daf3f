"""Claim 8, quantified: how the softmax Jacobian diag(p) - pp^T and the logit gradient shrink with logit std."""

from __future__ import annotations

import torch

from attnlab.repro.verdict import Table
from attnlab.writing.pages import fmt


def softmax_jacobian(p: torch.Tensor) -> torch.Tensor:
    """diag(p) - p p^T for each row of p (..., n) -> (..., n, n)."""
    return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)


def jacobian_vs_logit_std(stds, n: int = 64, rows: int = 2000, seed: int = 0) -> list[dict]:
    """For logits std * z (z ~ N(0, I_n)): mean max prob, mean Frobenius and spectral norm of the Jacobian,
    and the mean norm of the logit gradient J g for a unit-variance upstream gradient g (what reaches q and k)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, n, generator=g, dtype=torch.float64)
    up = torch.randn(rows, n, generator=g, dtype=torch.float64)
    out = []
    for s in stds:
        p = (z * s).softmax(-1)
        jac = softmax_jacobian(p)
        grad = (jac @ up.unsqueeze(-1)).squeeze(-1)  # J is symmetric, so J^T g = J g
        out.append(
            {
                "logit_std": float(s),
                "max_p": float(p.max(-1).values.mean()),
                "jac_fro": float(torch.linalg.matrix_norm(jac, "fro").mean()),
                "jac_spec": float(
                    torch.linalg.eigvalsh(jac).amax(-1).mean()
                ),  # J is symmetric PSD: ||J||_2 = its top eigenvalue
                "grad_norm": float(grad.norm(dim=-1).mean()),
            }
        )
    return out


def jacobian_table(rows: list[dict], n: int) -> Table:
    return Table(
        f"Softmax Jacobian diag(p) - pp^T over n = {n} keys vs logit std (means over random logit rows, float64)",
        ["logit std", "mean max p", "||J||_F", "||J||_2", "||J g|| (g ~ N(0, I))"],
        [
            [fmt(r["logit_std"], 2), fmt(r["max_p"]), fmt(r["jac_fro"]), fmt(r["jac_spec"]), fmt(r["grad_norm"])]
            for r in rows
        ],
        note="std 1 is what 1/sqrt(d) scaling gives for unit-variance q, k; std sqrt(d_k) (4, 8, 11.3, 16, 32) is the unscaled case.",
    )

"""The attention layer the model calls: backend, scaling, ALiBi bias and escape slot chosen by config."""
from __future__ import annotations

import torch
from torch import nn

from .backends import attend, attention_logits
from .position import alibi_bias, alibi_slopes
from .scaling import Scale
from .sink import SinkLogit, attend_with_sink, with_escape


class Attention(nn.Module):
    """softmax(s * q.k^T + bias + M) v over (B, H, T, d_k) tensors, with an optional escape slot.

    Statistics callbacks hook this module: its forward inputs are the post-norm (and, with RoPE,
    rotated) q, k, v; ``softmax_scale()``, ``logit_bias(rows, keys)`` and ``sink_logit()`` give
    the rest of what decides the probabilities, and ``probabilities(q, k)`` recomputes them for
    any backend. ``kernel`` names the kernel that ran in the last forward.
    """

    def __init__(
        self,
        backend: str,
        scaling: str,
        n_head: int,
        d_k: int,
        sigma_q: float = 1.0,
        sigma_k: float = 1.0,
        mask_fill: str = "-inf",
        dropout: float = 0.0,
        causal: bool = True,
        alibi: bool = False,
        sink: str = "none",
    ):
        super().__init__()
        self.backend, self.mask_fill, self.dropout, self.causal = backend, mask_fill, dropout, causal
        self.scale = Scale(scaling, d_k, n_head, sigma_q, sigma_k)
        if alibi:  # not persistent: fixed by n_head, so checkpoints hold only what trains
            self.register_buffer("alibi_slopes", alibi_slopes(n_head), persistent=False)
        else:
            self.alibi_slopes = None
        self.sink = SinkLogit(sink, n_head) if sink != "none" else None
        self.kernel: str | None = None  # the last forward's kernel (a probe's too)
        self.training_kernels: list[str] = []  # kernels of the training forwards, in order of first use

    def softmax_scale(self) -> float | torch.Tensor:
        return self.scale()

    def logit_bias(self, rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor | None:
        """The additive logit bias (H, len(rows), len(keys)) for these query and key positions
        (ALiBi), or None."""
        if self.alibi_slopes is None:
            return None
        return alibi_bias(self.alibi_slopes.to(rows.device), rows, keys)

    def sink_logit(self) -> torch.Tensor | None:
        """The per-head escape logit (H,), or None without an escape slot."""
        return None if self.sink is None else self.sink()

    def _bias(self, t_q: int, t_k: int, device) -> torch.Tensor | None:
        return self.logit_bias(torch.arange(t_k - t_q, t_k, device=device), torch.arange(t_k, device=device))

    @torch.no_grad()
    def probabilities(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """fp32 weights (B, H, Tq, Tk) on the real keys as this layer computes them; with an escape
        slot, row i sums to 1 - escape_i. Rows with no visible key are zero. Autocast is switched
        off here: a probe under bf16-mixed captures bf16 q, k, but the weights are measured in fp32."""
        with torch.autocast(q.device.type, enabled=False):
            return self._fp32_probabilities(q.float(), k.float())

    def _fp32_probabilities(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        scale = self.softmax_scale()
        scale = scale.detach().float() if torch.is_tensor(scale) else scale
        bias = self._bias(q.shape[-2], k.shape[-2], q.device)
        logits, mask = attention_logits(q, k, scale, self.causal, bias=bias)
        if self.sink is None:
            p = torch.softmax(logits, dim=-1)
            return p if mask is None else p.masked_fill(~mask.any(-1, keepdim=True), 0.0)
        return with_escape(logits, self.sink_logit().detach().float())[0]

    def forward(self, q, k, v, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        kwargs = dict(causal=self.causal, key_padding_mask=key_padding_mask, mask_fill=self.mask_fill,
                      dropout_p=self.dropout if self.training else 0.0)
        bias = self._bias(q.shape[-2], k.shape[-2], q.device)
        if self.sink is not None:
            out, kernel = attend_with_sink(self.backend, q, k, v, self.softmax_scale(), self.sink_logit(),
                                                bias=bias, **kwargs)
        else:
            out, kernel = attend(self.backend, q, k, v, self.softmax_scale(),
                                      **kwargs, **({"bias": bias} if bias is not None else {}))
        self.kernel = kernel
        if self.training and torch.is_grad_enabled() and kernel not in self.training_kernels:
            self.training_kernels.append(kernel)  # probes run in eval mode under no_grad: never counted
        return out

    def extra_repr(self) -> str:
        alibi = ", alibi" if self.alibi_slopes is not None else ""
        return f"backend={self.backend}, mask_fill={self.mask_fill}, causal={self.causal}{alibi}"

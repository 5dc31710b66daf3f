"""Multi-head latent attention (MLA, DeepSeek-V2 section 2.1.2): its projections, its cache row and
its two ways to attend. ``LatentAttention`` is mixed into ``AttentionLayer``, so its parameters stay
the layer's (checkpoints and the DeepSeek-V3 export keep their names).

Per token, x gives a latent c (d_c, RMS-normed) and a RoPE key k_rope (d_rope) shared by the heads;
the cache holds the row [c, k_rope]. Head h's key is [W_UK_h c, k_rope] and its value W_UV_h c
(``kv_up``'s key rows, then its value rows, d_k of each per head).

  expanded  every cached latent is expanded into every head's key and value, and the heads attend
            as multi-head attention does: the training forward's computation, the one whose
            per-head q, k, v the statistics record (``Intermediates``) and the knockout edits.
  absorbed  W_UK maps each head's content query into latent space (q_c W_UK_h, d_c wide), the
            heads attend as multi-query attention over the cached rows themselves, scores
            q_lat . c + q_rope . k_rope at the same scale, and W_UV maps each head's d_c-wide
            output back to d_k. Nothing per key is expanded. As DeepSeek-V2's inference note
            has it, W_UK is folded into the query projection and W_UV into the output projection
            (``absorbed_weights``; with a gate, which multiplies each head's d_k-wide output,
            W_UV runs as a map).

Multiply-adds of t_q queries over t_k keys, one layer (``step_macs``):

  expanded  t_k d_c 2 H d_k (the expansion)  +  t_q t_k H (2 d_k + d_rope)
  absorbed  2 t_q H d_k d_c (W_UK and W_UV as maps)  +  t_q t_k H 2 (d_c + d_rope)

The expansion is paid per key, absorption per query: a decoding step (t_q = 1) is cheaper absorbed
at any t_k; a prefill (t_q = t_k) is cheaper expanded once d_c > d_k, where the absorbed heads'
dot products, d_c + d_rope wide against d_k + d_rope, outgrow the expansion. A cache's
``latent_decode`` picks (attention/cache.py; ``auto``: the fewer multiply-adds). The absorbed
values are read as whole rows and the RoPE columns of the output dropped: the fused kernels want
one head dim for q, k and v, and a narrower v sends SDPA to its math kernel, tens of times slower.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.attention.backends import attend
from attnlab.attention.masks import Visibility
from attnlab.attention.weights import per_head

NON_CAUSAL = Visibility(causal=False)


def step_macs(t_q: int, t_k: int, n_head: int, d_k: int, d_c: int, d_rope: int) -> dict[str, int]:
    """Multiply-adds of one latent layer's attention for ``t_q`` queries over ``t_k`` keys, per
    sequence, in each form (module docstring); the projections of x, alike in both, left out."""
    return {
        "expanded": t_k * d_c * 2 * n_head * d_k + t_q * t_k * n_head * (2 * d_k + d_rope),
        "absorbed": 2 * t_q * n_head * d_k * d_c + t_q * t_k * n_head * 2 * (d_c + d_rope),
    }


class LatentAttention:
    """MLA's part of ``AttentionLayer`` (module docstring). ``latent_path`` names the form the last
    forward took ("absorbed" or "expanded"), as ``Attention.kernel`` names its kernel."""

    latent_path: str | None = None

    def _build_latent(self, d_model: int, n_head: int, d_k: int) -> None:
        """MLA's projections (``LatentConfig``). ``qkv_proj`` reads x once for the queries (or
        their latent, d_cq), the key/value latent (d_c) and the RoPE key (d_rope): ``qkv_parts``
        names them q, k and v. ``kv_up`` expands a latent into every head's key (its first
        n_head * d_k rows) and value; ``q_up`` a query latent into the queries, each head's d_k
        content part then its d_rope RoPE part. Each latent is RMS-normed before its expansion, as
        in DeepSeek-V2."""
        lat = self.latent
        q_width = n_head * (d_k + lat.d_rope)
        self.qkv_sizes = (lat.d_cq or q_width, lat.d_c, lat.d_rope)
        self.kv_norm = nn.RMSNorm(lat.d_c, eps=1e-6)
        self.kv_up = nn.Linear(lat.d_c, 2 * n_head * d_k, bias=False)
        self.q_latent_norm = nn.RMSNorm(lat.d_cq, eps=1e-6) if lat.d_cq else None
        self.q_up = nn.Linear(lat.d_cq, q_width, bias=False) if lat.d_cq else None

    def _latent_qkv(self, x, cache):
        """The expanded form's q, k (B, H, T|T_k, d_k + d_rope) and v (B, H, T_k, d_k) as the kernel
        takes them, the cache updated: every cached latent expanded into every head's key and value."""
        self.latent_path = "expanded"
        lat, h, d = self.latent, self.n_head, self.d_k
        b, t, _ = x.shape
        q, c, k_rope = self.qkv_proj(x).split(self.qkv_sizes, dim=-1)
        if self.q_up is not None:
            q = self.q_up(self.q_latent_norm(q))
        q_c, q_rope = q.view(b, t, h, d + lat.d_rope).transpose(1, 2).split((d, lat.d_rope), dim=-1)
        q_rope, c, k_rope, _ = self._rows(q_rope, c, k_rope, cache)
        k_c, v = (self._heads(part) for part in self.kv_up(c.squeeze(1)).split(h * d, dim=-1))
        k = torch.cat([k_c, k_rope.expand(-1, h, -1, -1)], dim=-1)
        return torch.cat([q_c, q_rope], dim=-1), k, v

    def _rows(self, q_rope, c, k_rope, cache):
        """q_rope rotated, c (B, 1, T_k, d_c) RMS-normed and k_rope (B, 1, T_k, d_rope) rotated, of every
        position, the cache updated; with a cache c and k_rope are views of its rows [c, k_rope]
        (B, 1, T_k, d_c + d_rope), returned last (else None). A plain cache stores keys rotated at their
        position in the text; a rolling one before RoPE, every key then rotated at its index in the
        cache and the queries last (as ``_rotated_and_cached``)."""
        t, d_c = q_rope.shape[-2], self.latent.d_c
        c, k_rope = self.kv_norm(c).unsqueeze(1), k_rope.unsqueeze(1)  # (B, 1, T, d_c), (B, 1, T, d_rope)
        rope_in_cache = cache is not None and cache.keys_before_rope
        if self.rotary is not None and not rope_in_cache:
            start = 0 if cache is None else cache.length
            q_rope, k_rope = self.rotary(q_rope, start), self.rotary(k_rope, start)
        if cache is None:
            return q_rope, c, k_rope, None
        rows, _ = cache.update(torch.cat([c, k_rope], dim=-1), None)
        if self.rotary is not None and rope_in_cache:
            q_rope = self.rotary(q_rope, rows.shape[-2] - t)
            rows = torch.cat([rows[..., :d_c], self.rotary(rows[..., d_c:])], dim=-1)
        return q_rope, rows[..., :d_c], rows[..., d_c:], rows

    def _absorbs(self, cache, t_q: int) -> bool:
        """Whether this forward takes the absorbed form: only over a cache (a full forward is the
        training computation), never where a per-head key is read, and as the cache's
        ``latent_decode`` says (``auto``: the form with fewer multiply-adds, ``step_macs``)."""
        if cache is None or cache.latent_decode == "expanded":
            return False
        # statistics record each head's q, k, v (Intermediates); a knockout recomputes one head's
        # weights from its own keys: both read the expanded keys
        if self.attention.record_to is not None or self.attention.knockout is not None:
            return False
        if cache.latent_decode == "absorbed":
            return True
        t_k = cache.next_position(t_q) + t_q
        macs = step_macs(t_q, t_k, self.n_head, self.d_k, self.latent.d_c, self.latent.d_rope)
        return macs["absorbed"] < macs["expanded"]

    def _absorbed_forward(self, x, cache, key_padding_mask) -> torch.Tensor:
        """The layer's output (B, T, d_model) in the absorbed form, the cache updated: the queries
        straight into latent space and, without a gate, the heads' d_c-wide outputs straight into
        the residual stream (``absorbed_weights``)."""
        self.latent_path = "absorbed"
        lat, h, d = self.latent, self.n_head, self.d_k
        d_c, width = lat.d_c, lat.d_c + lat.d_rope
        b, t, _ = x.shape
        w_in, b_in, w_out = self.absorbed_weights()
        if self.q_up is None:
            q, c, k_rope = F.linear(x, w_in, b_in).split((h * width, d_c, lat.d_rope), dim=-1)
        else:
            q, c, k_rope = self.qkv_proj(x).split(self.qkv_sizes, dim=-1)
            q = F.linear(self.q_latent_norm(q), w_in)
        q_lat, q_rope = q.view(b, t, h, width).transpose(1, 2).split((d_c, lat.d_rope), dim=-1)
        q_rope, _, _, rows = self._rows(q_rope, c, k_rope, cache)
        out = self._attend_rows(torch.cat([q_lat, q_rope], dim=-1), rows, key_padding_mask)[..., :d_c]
        if self.gate_proj is None:
            return F.linear(out.transpose(1, 2).reshape(b, t, h * d_c), w_out, self.out_proj.bias)
        # the gate multiplies each head's d_k-wide output: W_UV first, then the gate, then out_proj
        w_uv = self.kv_up.weight[h * d :].view(h, d, d_c)
        out = torch.matmul(out.transpose(0, 1).reshape(h, b * t, d_c), w_uv.transpose(1, 2))  # (H, B T, d_k)
        out = out.view(h, b, t, d).transpose(0, 1)
        out = out * torch.sigmoid(self._heads_gate(self.gate_proj(x))).to(out.dtype)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, h * d))

    def absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(w_in, b_in, w_out), W_UK folded into the query projection and W_UV into the output
        projection (DeepSeek-V2's inference note): w_in is ``qkv_proj``'s weight (``q_up``'s with a
        query latent) with each head's d_k content rows replaced by W_UK_h^T times them (d_c rows),
        b_in its bias alike (or None), w_out (d_model, H d_c) = out_proj's head-h columns times W_UV_h.
        Without autograd they are kept until a source weight changes (its storage or autograd's
        version counter, as ``GPT.decode_head``'s copy)."""
        sources = [self.kv_up.weight, self.out_proj.weight, self.qkv_proj.weight, self.qkv_proj.bias]
        if self.q_up is not None:
            sources.append(self.q_up.weight)
        key = tuple((p.data_ptr(), p._version, p.dtype) for p in sources if p is not None)
        cached = getattr(self, "_absorbed", None)
        if cached is not None and cached[0] == key and not torch.is_grad_enabled():
            return cached[1]
        weights = self._fold()
        if not torch.is_grad_enabled():
            self._absorbed = (key, tuple(w if w is None else w.detach() for w in weights))
        return weights

    def _fold(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        lat, h, d = self.latent, self.n_head, self.d_k
        d_c, width = lat.d_c, d + lat.d_rope
        w = self.kv_up.weight.view(2, h, d, d_c)
        w_uk, w_uv = w[0], w[1]  # (H, d_k, d_c): head h's key rows, its value rows
        src = self.q_up if self.q_up is not None else self.qkv_proj
        w_q = src.weight[: h * width].view(h, width, -1)
        w_q = torch.cat([w_uk.transpose(1, 2) @ w_q[:, :d], w_q[:, d:]], dim=1).reshape(h * (d_c + lat.d_rope), -1)
        b_in = None
        if src.bias is not None:
            b_q = src.bias[: h * width].view(h, width, 1)
            b_q = torch.cat([w_uk.transpose(1, 2) @ b_q[:, :d], b_q[:, d:]], dim=1).reshape(-1)
            b_in = torch.cat([b_q, src.bias[h * width :]])
        w_in = w_q if self.q_up is not None else torch.cat([w_q, src.weight[h * width :]])
        w_o = self.out_proj.weight.view(-1, h, d).transpose(0, 1)  # (H, d_model, d_k)
        w_out = (w_o @ w_uv).transpose(0, 1).reshape(-1, h * d_c)  # (d_model, H d_c)
        return w_in, b_in, w_out

    def _attend_rows(self, q, rows, key_padding_mask) -> torch.Tensor:
        """Multi-query attention of q (B, H, T, D) over the rows (B, 1, T_k, D), keys and values both,
        by the layer's backend and weight rule; (B, H, T, D).

        One query that sees every key (a decoding step without a window, key padding or escape
        slot) goes in as H rows of one head: each kernel then reads the shared rows once, where
        broadcasting them to H heads copies the cache H times on the explicit kernels."""
        att = self.attention
        b, h, t_q, width = q.shape
        t_k = rows.shape[-2]
        scale, escape = att.softmax_scale(), att.escape_logit()
        bias = None
        if att.alibi_slopes is not None:
            bias = att.logit_bias(torch.arange(t_k - t_q, t_k, device=q.device), torch.arange(t_k, device=q.device))
        dropout_p = att.dropout if att.training else 0.0
        if t_q == 1 and key_padding_mask is None and escape is None and not att.visibility.beyond_causal:
            if torch.is_tensor(scale):  # a learned per-head scale, folded into its head's query
                q, scale = q * per_head(scale, q), 1.0
            out, kernel = attend(
                att.backend,
                q.reshape(b, 1, h, width),
                rows,
                rows,
                scale,
                visibility=NON_CAUSAL,  # the one query sees every key
                mask_fill=att.cfg.mask_fill,
                dropout_p=dropout_p,
                bias=None if bias is None else bias.view(1, 1, h, t_k),
                normalize=att.cfg.normalize,
                context_keys=att.context_keys(),
            )
            out = out.view(b, h, 1, width)
        else:
            out, kernel = attend(
                att.backend,
                q,
                rows,
                rows,
                scale,
                visibility=att.visibility,
                key_padding_mask=key_padding_mask,
                mask_fill=att.cfg.mask_fill,
                dropout_p=dropout_p,
                bias=bias,
                normalize=att.cfg.normalize,
                escape=escape,
                context_keys=att.context_keys(),
            )
        att.ran(kernel)
        return out

    @torch.no_grad()
    def _clip_latent(self, gamma: torch.Tensor) -> None:
        """QK-clip's gamma (H,) on latent attention: the content parts sqrt(gamma) each, the RoPE
        query gamma (its key is shared by the heads)."""
        d, w = self.d_k, self.q_up.weight if self.q_up is not None else self.qkv_parts(self.qkv_proj.weight).q
        q_rows = w.view(self.n_head, d + self.latent.d_rope, -1)
        q_rows[:, :d].mul_(gamma.sqrt().view(-1, 1, 1).to(w.dtype))
        q_rows[:, d:].mul_(gamma.view(-1, 1, 1).to(w.dtype))
        k_rows = self.kv_up.weight[: self.n_head * d].view(self.n_head, d, -1)
        k_rows.mul_(gamma.sqrt().view(-1, 1, 1).to(w.dtype))

"""Attention kernels: one signature, the kernel that actually ran is returned beside the output.

q, k, v are (B, H, T, d_k). ``scale`` is a float or a per-head (H,) tensor.
Backends:
  naive, scaled  explicit softmax(s QK^T + M) V (they differ only in their default scaling rule)
  sdpa           F.scaled_dot_product_attention, PyTorch picks the kernel
  flash          FlashAttention, forced: flash_attn on CUDA when installed, else PyTorch's
                 FLASH_ATTENTION kernel (CUDA or CPU). Never falls back silently.

Causal masking is bottom-right aligned on every backend: q holds the last t_q of the t_k key
positions (a block of new queries over cached keys; t_q = t_k in training).

Under autocast the fused backends cast q, k, v to the autocast dtype themselves before they ask
which kernel will run and call it: SDPA's own autocast cast happens inside the call, too late for
the kernel query, and flash_attn takes no mixed inputs (qk_norm's LayerNorm may return fp32 q, k
beside a bf16 v).
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from attnlab.attention.masks import CAUSAL, Visibility
from attnlab.attention.normalizations import fused_names, normalization
from attnlab.attention.sink import slot_key_attention
from attnlab.attention.weights import WeightRule, expand_kv, per_head
from attnlab.util.errors import KernelUnavailable

BACKENDS = ("naive", "scaled", "sdpa", "flash")


def _fold_scale(q: torch.Tensor, scale: float | torch.Tensor) -> tuple[torch.Tensor, float]:
    """Fused kernels take a float scale only: fold a per-head tensor into q."""
    if torch.is_tensor(scale):
        return q * per_head(scale, q), 1.0
    return q, float(scale)


def explicit_attention(
    q,
    k,
    v,
    scale,
    visibility=CAUSAL,
    key_padding_mask=None,
    mask_fill="-inf",
    dropout_p=0.0,
    bias=None,
    normalize="softmax",
    escape=None,
    context_keys=None,
):
    """weights(q, k) v, with the weights of ``WeightRule`` (every normalisation, escape slot,
    visibility and key/value groups); ``bias`` a tensor broadcastable to (B, H, Tq, Tk)."""
    rule = WeightRule(
        scale=scale,
        visibility=visibility,
        mask_fill=mask_fill,
        normalize=normalize,
        escape=escape,
        bias=None if bias is None else (lambda rows, keys: bias),
        context_keys=context_keys,
    )
    probs = rule(q, k, key_padding_mask=key_padding_mask).p
    if dropout_p > 0:
        probs = F.dropout(probs, p=dropout_p)
    return probs.to(v.dtype) @ expand_kv(v, q.shape[1]), "eager"


def autocast_inputs(q, k, v):
    """q, k, v in the autocast dtype when autocast is on for their device (else unchanged)."""
    device = q.device.type
    if not torch.is_autocast_enabled(device):
        return q, k, v
    dtype = torch.get_autocast_dtype(device)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _sdpa_args(q, k, visibility: Visibility, key_padding_mask, bias=None):
    """(attn_mask, is_causal) for SDPA. Queries are the last t_q of the t_k key positions
    (bottom-right causal, as masks.Visibility and a KV cache want); is_causal serves where it states
    the rule (Visibility.causal_flag_states). One query needs no causal mask at all (it sees every
    key). Otherwise an explicit boolean mask; with a logit bias, a float mask holding the bias and
    -inf where a key is not visible."""
    t_q, t_k = q.shape[-2], k.shape[-2]
    if visibility.causal and t_q == 1:
        visibility = replace(visibility, causal=False)
    if key_padding_mask is None and bias is None and visibility.causal_flag_states(t_q, t_k):
        return None, visibility.causal
    mask = visibility.mask(t_q, t_k, key_padding_mask, q.device)
    if bias is None:
        return mask, False
    bias = bias.to(q.dtype)
    return (bias if mask is None else bias.masked_fill(~mask, float("-inf"))), False


_KERNEL_CHOICE: dict[tuple, str] = {}  # the selector's answer per input signature: asked once, not every forward


def _enabled_sdp_backends() -> tuple[bool, ...]:
    """The backends sdpa_kernel(...) currently allows: part of what the selector decides on."""
    b = torch.backends.cuda
    return (b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled(), b.cudnn_sdp_enabled())


def sdpa_kernel_name(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False) -> str:
    """Which kernel SDPA dispatches to for these inputs (asks PyTorch's own selector, once per
    signature: shapes, dtypes, device, grad, mask, dropout, causality and the enabled backends)."""
    if torch.compiler.is_compiling():
        return "compiled:sdpa"  # the compiler lowers SDPA itself; the eager selector does not apply
    key = (
        q.shape,
        k.shape,
        v.shape,
        q.dtype,
        k.dtype,
        v.dtype,
        q.device,
        q.requires_grad or k.requires_grad or v.requires_grad,
        None if attn_mask is None else (attn_mask.shape, attn_mask.dtype),
        dropout_p > 0,
        is_causal,
        scale,
        enable_gqa,
        _enabled_sdp_backends(),
    )
    name = _KERNEL_CHOICE.get(key)
    if name is None:
        try:
            idx = torch._fused_sdp_choice(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
            name = "sdpa:" + SDPBackend(idx).name.lower().replace("_attention", "")
        except Exception:  # private API: an unknown answer is better than a crash
            name = "sdpa:unknown"
        _KERNEL_CHOICE[key] = name
    return name


def sdpa_attention(
    q,
    k,
    v,
    scale,
    visibility=CAUSAL,
    key_padding_mask=None,
    mask_fill="-inf",
    dropout_p=0.0,
    bias=None,
):
    q, k, v = autocast_inputs(q, k, v)
    q, s = _fold_scale(q, scale)
    attn_mask, is_causal = _sdpa_args(q, k, visibility, key_padding_mask, bias)
    gqa = k.shape[1] != q.shape[1]  # key/value groups: SDPA broadcasts them itself
    kernel = sdpa_kernel_name(q, k, v, attn_mask, dropout_p, is_causal, s, gqa)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=s, enable_gqa=gqa
    )
    return out, kernel


FLASH_ATTN_DEVICES = {"cuda"}  # where the flash_attn package is used (tests add "cpu" with a stand-in module)
_FLASH_ATTN: dict[str, object] = {}  # the import's outcome, decided once per process


def flash_attn_package():
    """flash_attn's ``flash_attn_func``, or None when the package is not installed.

    Imported once. Installed but unusable (an ABI mismatch with torch or CUDA is common) is an
    error naming the import failure, never a silent switch to PyTorch's kernel.
    """
    if "outcome" not in _FLASH_ATTN:
        try:
            installed = sys.modules.get("flash_attn") is not None or importlib.util.find_spec("flash_attn") is not None
        except (ImportError, ValueError):
            installed = True  # a half-imported package: let the import below say what is wrong
        if not installed:
            _FLASH_ATTN["outcome"] = None
        else:
            try:
                from flash_attn import flash_attn_func
            except Exception as err:  # ImportError, OSError (undefined symbol), RuntimeError ...
                reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
                _FLASH_ATTN["outcome"] = KernelUnavailable(
                    f"attention=flash: flash_attn is installed but does not import ({type(err).__name__}: {reason}); "
                    "reinstall it for this torch/CUDA (pip install flash-attn --no-build-isolation) or uninstall it "
                    "to use PyTorch's flash kernel"
                )
            else:
                _FLASH_ATTN["outcome"] = flash_attn_func
    outcome = _FLASH_ATTN["outcome"]
    if isinstance(outcome, KernelUnavailable):
        raise outcome
    return outcome


def flash_attention(
    q,
    k,
    v,
    scale,
    visibility=CAUSAL,
    key_padding_mask=None,
    mask_fill="-inf",
    dropout_p=0.0,
    bias=None,
):
    if bias is not None:
        raise KernelUnavailable("attention=flash takes no logit bias (model.pos_encoding=alibi); use attention=sdpa")
    q, k, v = autocast_inputs(q, k, v)
    q, s = _fold_scale(q, scale)
    flash_attn_func = flash_attn_package() if q.device.type in FLASH_ATTN_DEVICES else None
    if flash_attn_func is not None:
        if q.dtype not in (torch.float16, torch.bfloat16):
            raise KernelUnavailable(
                f"flash_attn needs fp16/bf16 inputs, got {q.dtype}: use trainer.precision=bf16-mixed or attention=sdpa"
            )
        if key_padding_mask is not None:
            raise KernelUnavailable("flash_attn_func takes no padding mask: use attention=sdpa for padded batches")
        extra = visibility.flash_attn_kwargs()
        out = flash_attn_func(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            dropout_p=dropout_p,
            softmax_scale=s,
            causal=visibility.causal,
            **extra,
        )
        return out.transpose(1, 2), "flash_attn"
    visibility.check_forced_flash()
    attn_mask, is_causal = _sdpa_args(q, k, visibility, key_padding_mask)
    if key_padding_mask is None and attn_mask is not None:
        # causal with fewer queries than keys: the flash kernel takes no boolean mask, but its own
        # causal is bottom-right, which PyTorch reaches through causal_lower_right. That route
        # ignores enable_gqa, so key/value groups are expanded first.
        attn_mask = causal_lower_right(q.shape[-2], k.shape[-2])
        k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            out = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=attn_mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
                scale=s,
                enable_gqa=k.shape[1] != q.shape[1],
            )
    except RuntimeError as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise KernelUnavailable(
            f"attention=flash cannot run on {q.device.type} with {q.dtype}"
            f"{' and a padding mask' if key_padding_mask is not None else ''} ({reason}); use attention=sdpa"
        ) from None
    return out, "sdpa:flash"


KERNELS = {"naive": explicit_attention, "scaled": explicit_attention, "sdpa": sdpa_attention, "flash": flash_attention}
# each backend's scaling when no config says: conf/attention/<backend>.yaml is the source (what a run
# composes); this copy serves callers without a config (the kernel bench), and a test keeps them equal
DEFAULT_SCALING = {"naive": "none", "scaled": "inv_sqrt_d", "sdpa": "inv_sqrt_d", "flash": "inv_sqrt_d"}


EXPLICIT = ("naive", "scaled")  # the backends that compute the weights themselves (WeightRule)


def attend(
    backend: str,
    q,
    k,
    v,
    scale,
    normalize: str = "softmax",
    escape: torch.Tensor | None = None,
    context_keys: int | None = None,
    visibility: Visibility | None = None,
    causal: bool = True,
    **kwargs,
) -> tuple[torch.Tensor, str]:
    """Run ``backend`` and return (output, name of the kernel that ran). q is (B, H, T, d); k and v
    may have fewer heads (H_kv dividing H: grouped-query attention). ``escape``: (H,) escape
    logits, or None; ``normalize``: softmax, or sigmoid on the explicit backends (``context_keys``:
    its n, WeightRule); ``visibility``: the keys a query sees (masks.Visibility), by default
    ``Visibility(causal)``."""
    try:
        kernel = KERNELS[backend]
    except KeyError:
        raise KernelUnavailable(f"model.attention.backend={backend!r}; expected one of {', '.join(BACKENDS)}") from None
    if q.shape[1] % k.shape[1]:
        raise KernelUnavailable(
            f"{q.shape[1]} query heads cannot share {k.shape[1]} key/value heads: "
            "model.n_head must be a multiple of model.n_kv_head"
        )
    kwargs["visibility"] = Visibility(causal) if visibility is None else visibility
    if backend in EXPLICIT:
        return kernel(q, k, v, scale, normalize=normalize, escape=escape, context_keys=context_keys, **kwargs)
    if not normalization(normalize).fused:
        raise KernelUnavailable(
            f"attention={backend} normalises rows with {' or '.join(fused_names())}; "
            f"model.attention.normalize={normalize} runs on {' and '.join(EXPLICIT)}"
        )
    if escape is not None:
        if q.shape[-2] == 1 and not (backend == "flash" and kwargs.get("bias") is not None):
            # one query (a cached decoding step): the explicit route is the same matrix-vector work
            # as a fused kernel's, where the slot route would copy the whole cache to pad it
            return explicit_attention(q, k, v, scale, escape=escape, **kwargs)
        if backend == "flash":
            kwargs["visibility"].check_flash_slot()
        return slot_key_attention(kernel, q, k, v, scale, escape, **kwargs)
    return kernel(q, k, v, scale, **kwargs)

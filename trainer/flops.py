"""Parameter and FLOP counts derived from a ModelConfig (no arrays built).

What ``flops_per_token`` counts (training = forward + backward = 3x forward, 2 FLOPs per multiply-add):

- ``6 * N_matmul``: every weight matrix a token multiplies by: fused q/k/v and output projections,
  dense SwiGLU layers, shared experts, the ``top_k`` routed experts it is sent to, the router
  ``(D, E)`` and the output head ``(D, V)``. The embedding lookup is a gather (no FLOPs), norms and
  RoPE are elementwise (not counted).
- attention scores and weighted values: ``6 * 2 * n_layers * seq_len * n_heads * head_dim`` per token
  (QK^T and AV, forward 4*T*H*Dh per token per layer, times 3), counted over the full T x T square
  like PaLM's MFU (the XLA attention computes the full square and masks it).
- Capacity padding (empty expert slots), dropped assignments and the dispatch scatter/gather are NOT
  counted: they are overhead, not model FLOPs, so they lower MFU as they should.
"""

from __future__ import annotations

from trainer.model import ModelConfig, moe_layers

__all__ = ["flops_per_token", "param_counts", "param_breakdown"]


def param_breakdown(cfg: ModelConfig) -> dict[str, int]:
    """Parameter counts per kind, summed over layers (matches the nnx model's Param leaves)."""
    d, hd = cfg.d_model, cfg.n_heads * cfg.head_dim
    n_moe = len(moe_layers(cfg))
    n_dense = cfg.n_layers - n_moe
    return {
        "embed": cfg.vocab * d,
        "lm_head": d * cfg.vocab,
        "attention": cfg.n_layers * (d * 3 * hd + hd * d),
        "norms": cfg.n_layers * 2 * d + d + (cfg.n_layers * 2 * cfg.head_dim if cfg.qk_norm else 0),
        "dense_ffn": n_dense * 3 * d * cfg.d_ff,
        "shared_experts": n_moe * 3 * d * cfg.n_shared * cfg.d_shared,
        "routed_experts": n_moe * cfg.n_routed * 3 * d * cfg.d_expert,
        "router": n_moe * d * cfg.n_routed,
    }


def param_counts(cfg: ModelConfig) -> tuple[int, int]:
    """(total, active) parameters. Active counts ``top_k`` of the ``n_routed`` experts per MoE layer
    and includes embeddings, head, norms and router (the usual "A23B"-style figure)."""
    p = param_breakdown(cfg)
    total = sum(p.values())
    active = total - p["routed_experts"] + p["routed_experts"] * cfg.top_k // cfg.n_routed
    return total, active


def flops_per_token(cfg: ModelConfig, seq_len: int | None = None) -> float:
    """Training FLOPs per token (forward + backward); see the module docstring for what is counted."""
    p = param_breakdown(cfg)
    t = cfg.seq_len if seq_len is None else seq_len
    matmul = (
        p["lm_head"]
        + p["attention"]
        + p["dense_ffn"]
        + p["shared_experts"]
        + p["router"]
        + p["routed_experts"] * cfg.top_k / cfg.n_routed
    )
    attn = 12 * cfg.n_layers * t * cfg.n_heads * cfg.head_dim
    return 6.0 * matmul + attn

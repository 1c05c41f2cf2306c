"""Dense Synthesizer (Tay et al., "Synthesizer", arXiv 2005.00743, ICML 2021), §3.1.

    B_i = F(X_i) = W₂ σ_R(W₁ X_i + b₁) + b₂ ∈ R^ℓ,    Y = softmax(B) G(X)

Each token X_i (the query-side input `x` of the attention sublayer) synthesizes its own
row of ℓ = `max_len` logits, one per key position, without looking at any other token; the
logits of a call are the columns of the key positions, B_i[k_pos[j]]. Rows depend on the
token only, so cached decoding needs nothing beyond the current token. No q or k is
computed; v is the usual value projection.

Conventions:
- Per head h and layer: W₁ʰ: d → `hidden_dim` (default d_h, the width mesh-tf uses: its
  first layer is the query projection), W₂ʰ: hidden_dim → ℓ, biases b₁ʰ, b₂ʰ. The paper
  gives F per head; `shared_output: true` shares W₂ and b₂ across heads as the released
  mesh-tf code does (`dense_minus`; its W₂ has no head axis). mesh-tf also has no biases.
- Weights are glorot-uniform per head matrix (fans d, hidden_dim and hidden_dim, ℓ);
  biases start at 0.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.shape import StackShape
from attnlab.synthesizer.base import Synthesis, Synthesizer, glorot_uniform, require_positive


class TokenMLP(nn.Module):
    """F(X_i) = W₂ σ_R(W₁ X_i + b₁) + b₂ ∈ R^out_dim per token, head and layer."""

    per_layer = ("w1", "b1", "w2", "b2")

    def __init__(
        self, shape: StackShape, out_dim: int, hidden_dim: int, shared_output: bool
    ) -> None:
        super().__init__()
        n, h, d = shape.n_layers, shape.n_heads, shape.d_model
        out_heads = 1 if shared_output else h
        self.w1 = nn.Parameter(glorot_uniform((n, h, d, hidden_dim), d, hidden_dim))
        self.b1 = nn.Parameter(torch.zeros(n, h, 1, hidden_dim))
        self.w2 = nn.Parameter(
            glorot_uniform((n, out_heads, hidden_dim, out_dim), hidden_dim, out_dim)
        )
        self.b2 = nn.Parameter(torch.zeros(n, out_heads, 1, out_dim))

    def forward(self, x: Tensor, layer: int, columns: Tensor) -> Tensor:
        """Entries `columns` of F(X_i) for x [B, Lq, d]: [B, H, Lq, len(columns)].

        Only the needed columns of W₂ are multiplied, not all out_dim of them.
        """
        hidden = torch.relu(x[:, None] @ self.w1[layer] + self.b1[layer])
        return hidden @ self.w2[layer][..., columns] + self.b2[layer][..., columns]


class Dense(Synthesizer):
    key_positions = True  # row i is a function of token i alone, over key positions

    def __init__(
        self,
        shape: StackShape,
        max_len: int,
        hidden_dim: int | None,
        shared_output: bool,
    ) -> None:
        super().__init__(shape)
        hidden_dim = shape.head_dim if hidden_dim is None else hidden_dim
        require_positive("max_len", max_len)
        require_positive("hidden_dim", hidden_dim)
        self.max_len = max_len
        self.f = TokenMLP(shape, max_len, hidden_dim, shared_output)

    def forward(self, x: Tensor, q_pos: Tensor, k_pos: Tensor, layer: int) -> Synthesis:
        return Synthesis(dot=None, logits=self.f(x, layer, k_pos))

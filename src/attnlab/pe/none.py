"""NoPE: no positional information anywhere, s_ij = q_i·k_j/√d_h.

Self-attention is then permutation-equivariant in the queries and invariant to a joint
permutation of keys and values, for every normalizer. Under a causal mask, position can
still be recovered (Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length
Generalization in Transformers", arXiv 2305.19466), most directly through normalizers whose
rows do not sum to 1 (Su 2022, kexue.fm/archives/9105).
"""

from attnlab.pe.base import PositionalEncoding


class NoPE(PositionalEncoding):
    pass

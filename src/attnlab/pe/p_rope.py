"""p-RoPE (Barbero, Vitvitskyi, Perivolaropoulos, Pascanu, Veličković 2025, "Round and Round
We Go! What makes Rotary Positional Encodings useful?", arXiv 2410.06205, ICLR 2025): RoPE
with only the highest fraction p of its frequencies.

RoPE's θ_i = base^(−2i/d) for the first ⌊p·d/2⌋ pairs, the fastest-rotating; the remaining
pairs, RoPE's lowest frequencies, get θ = 0 and pass through unrotated, free to carry
content without a position-dependent drift. p = 1 is RoPE; p = 0 is NoPE.

What differs from RoPE: the frequencies only. Unlike RoPE's `rotary_dim`, which recomputes
θ over fewer dimensions (θ_i = base^(−2i/d_r)), the kept frequencies are RoPE's own over
the whole head. Conventions: the number of kept pairs is rounded down; every RoPE option
(layout, partial rotary, context scaling of the kept frequencies) applies as in RoPE.
"""

from __future__ import annotations

from typing import Any

from attnlab.config.values import is_number
from attnlab.errors import ConfigError
from attnlab.pe.rope import RoPE
from attnlab.shape import StackShape


class PRoPE(RoPE):
    def __init__(self, shape: StackShape, fraction: float, **rope: Any) -> None:
        super().__init__(shape, **rope)
        if not (is_number(fraction) and 0 <= fraction <= 1):
            raise ConfigError(
                f"pe.fraction={fraction!r} must be between 0 (no rotation) and 1 (RoPE): the "
                "share of RoPE's frequencies, highest first, that rotate"
            )
        self.fraction = fraction
        kept = int(fraction * len(self.frequencies))
        self.frequencies = self.frequencies.clone()
        self.frequencies[kept:] = 0.0

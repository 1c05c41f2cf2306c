"""GAU's squared ReLU (Hua, Dai, Liu, Le 2022, arXiv 2202.10447): a_ij = relu(s_ij)² / n_i.

Convention: s_ij is the usual scaled score q·k/√d_h (+ PE terms), as in the paper's main
text relu²(QKᵀ/√s)/n, not the appendix code's effective 1/n² scale; n_i is the number of
keys query i may attend to, so padding does not change a row and a causal row divides by
its own length (Su's correction, kexue.fm/archives/8934). Masked entries are zeroed after
the activation. Rows do not sum to 1 and the normalizer is not invariant to a per-row shift.
"""

import torch.nn.functional as F
from torch import Tensor

from attnlab.norm.base import Normalizer, visible_keys, zero_masked


class ReLU2(Normalizer):
    def normalize(self, scores: Tensor, mask: Tensor | None, layer: int) -> Tensor:
        return zero_masked(F.relu(scores).square() / visible_keys(scores, mask), mask)

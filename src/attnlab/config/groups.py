"""The config groups (conf/<group>/) by what they decide, and the keys every option carries."""

from __future__ import annotations

METADATA = ("name", "description", "paper")
DESCRIPTIVE = ("_target_", "description", "paper")  # what a node is and where its class lives
# The config groups (conf/<group>/) by what they decide; every other list of them derives
# from these.
VARIANTS = ("pe", "norm", "synthesizer")  # the attention's parts
ARCHITECTURE = ("model", "block", *VARIANTS)  # what the weights are built for
REPORTING = ("logger", "callbacks", "extras")  # what a run records and prints, not what ran
PRESETS = ("experiment", "hparams_search", "debug")  # choices of the groups above, bundled
OUTPUT = ("paths", "hydra", "hydra/launcher")  # where output goes and how jobs are launched
GROUPS = ("task", *VARIANTS, "block", "model", "schedule", "trainer", *REPORTING, *PRESETS, *OUTPUT)
# model settings that choose kernels or a starting point, not what the trained weights are
NOT_WEIGHTS = ("fast_attention", "flex_attention", "attention_chunk", "compile", "init_std")

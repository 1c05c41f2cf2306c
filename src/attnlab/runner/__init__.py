"""Running training and evaluation: the entry points (train, evaluate), a run built from its
config (run, preflight, job), its checkpoints and resumption (checkpoints, resume), and the
callbacks every run has."""

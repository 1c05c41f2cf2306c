"""The tasks, one package per family, each holding its data (`data.py`), its system
(`system.py`: the LightningModule's metrics and evaluation) and its report (`report.py`: its
tables and plots in `attnlab compare` and RESULTS.md):

    lm         task=lm: running text as a token stream, perplexity at 1x-16x the training
               length, attention sinks
    synthetic  task=copy, reverse, sort, addition, parity, mqar, passkey: train short, test
               long, exact match by bucket of lengths; one generator module a task
    probe      task=probe: n identical tokens, predict each one's position
    seq2seq    task=translation (multi30k, wmt) and task=chitchat (dailydialog): an
               encoder-decoder over text pairs, BLEU and the dialogue scores
"""

"""Evaluate a checkpoint: `python eval.py ckpt_path=...` (see README)."""

from attnlab.runner.evaluate import main

if __name__ == "__main__":
    main()

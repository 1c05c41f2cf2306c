"""Train one configuration: `python train.py pe=rope norm=l2 task=probe` (see README)."""

from attnlab.runner.train import main

if __name__ == "__main__":
    main()

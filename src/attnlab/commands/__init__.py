"""The `attnlab` command (cli) and the commands that put a checkpoint to use: generate,
translate, chat, export (attnlab.stored), and prune; their key=value settings."""

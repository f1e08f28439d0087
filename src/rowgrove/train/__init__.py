"""The reference GRPO trainer: config, update, loop, checkpoints, metrics and report."""

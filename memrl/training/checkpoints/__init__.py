"""Checkpoints (save, verify, resume) and what a run may do with an out_dir that already holds one."""

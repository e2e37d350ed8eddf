"""Validation by Megatron-LM's own pretrain_gpt.py, one launch per arm: the arm's arguments (args.py), the
plan of arms and where their ranks run (plan.py), one launch and its record (arm.py), the shim each rank
runs under (rank.py: `python -m moebench.megatron.lm.rank`), Megatron's log (log.py), the verdict
(verdict.py), and the validate / arm / compare commands (commands.py)."""

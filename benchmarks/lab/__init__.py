"""The lab: A/B and one-off measurements behind a default or a record's table.

Not what a user or an operator runs (that is benchmarks/: the Makefile's targets, gpu_check,
soak and the checks docs/ points operators to); each script here says which default or
record under benchmarks/results/records/ it measured. Run one as `python -m
benchmarks.lab.<name>`.
"""

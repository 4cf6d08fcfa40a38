"""Fault injection: run small Caramel jobs, break them on purpose, measure what happens.

    python experiments/fault_matrix.py          # every experiment; writes docs/reliability.md

Modules: `worker` (the training job the experiments run), `harness` (N local workers, signals,
exit codes and times), `result` (FaultResult and the registry), one module per fault class
(`process`, `disagree`, `storage`, `restart`, `network`), and `matrix` (run all, render the table).
"""

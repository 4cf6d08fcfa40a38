"""`caramel tune`: search strategy options with a cheap model (the simulator) and few measurements.

`space` enumerates the knob grid and embeds candidates for clustering; `search` holds the
model-guided search (Chameleon-style: score every candidate with the corrected model, cluster
the most promising, measure one representative per cluster, correct the model, repeat) and the
baselines users have today (random search, Optuna's TPE) under the same measurement budget;
`objective` builds the simulator-backed model and measurement for a profile and cluster;
`ledger` answers measurements of real steps taken in advance and charges each method the real
steps of the candidates it asks for.
"""

"""The digits workload's model and data as a zoo factory, for `caramel profile --dropout-table`.

`caramel train --workload digits` trains `DigitsNet`; its dropout table must be measured on
the same model (the same droppable groups) and, for the accuracy column, on the same images:

    caramel profile --model experiments/dropout_digits.py:factory \
        --dropout-table docs/results/adapt-dropout-table-digits.json

The zoo calls a user factory with no arguments after seeding torch (`torch.initial_seed()`):
seed 0 gives a batch of `BATCH` images drawn from the training split (the table trains and
times on it), any other seed the whole validation split (the table's held-out loss); the
model is built from seed 0 either way. The width and depth are those of the
measured `caramel train` runs (`--d-model 1024`, 2 hidden layers).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from caramel.train.data import digits_datasets
from caramel.train.workloads import DigitsNet

HIDDEN, LAYERS, DROPOUT, VAL_FRACTION, BATCH = 1024, 2, 0.1, 0.1, 128  # caramel train's defaults but the width


def factory():
    seed = torch.initial_seed()
    train, val = digits_datasets(VAL_FRACTION)
    torch.manual_seed(0)
    model = DigitsNet(HIDDEN, LAYERS, DROPOUT)
    if seed == 0:
        idx = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))[:BATCH]
        x, y = train.batch(idx)
    else:
        x, y = val.inputs, val.targets
    return model, (x, y), F.cross_entropy

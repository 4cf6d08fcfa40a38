"""The digits workload's model and data as a zoo factory, for `caramel profile --dropout-table`.

`caramel train --workload digits` trains `DigitsNet`; its dropout table must be measured on
the same model (the same droppable groups) and, for the accuracy column, on the same images:

    caramel profile --model experiments/dropout_digits.py:factory --batch-size 128 \
        --dropout-table docs/results/adapt-dropout-table-digits.json

seed 0 gives a batch drawn from the training split (the table trains on it), any other seed the
whole validation split (the table's held-out loss). The width and depth are those of the
measured `caramel train` runs (`--d-model 1024`, 2 hidden layers).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from caramel.models.zoo import ModelBatch
from caramel.train.data import digits_datasets
from caramel.train.workloads import DigitsNet

HIDDEN, LAYERS, DROPOUT, VAL_FRACTION = 1024, 2, 0.1, 0.1  # caramel train's defaults but the width


def factory(batch_size: int = 128, seed: int = 0) -> ModelBatch:
    train, val = digits_datasets(VAL_FRACTION)
    torch.manual_seed(0)
    model = DigitsNet(HIDDEN, LAYERS, DROPOUT)
    if seed == 0:
        idx = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))[:batch_size]
        x, y = train.batch(idx)
    else:
        x, y = val.inputs, val.targets
    return ModelBatch("digits", model, x, y, F.cross_entropy)

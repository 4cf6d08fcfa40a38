"""dlADMM: layer-wise, gradient-free training of ReLU MLPs, on one process or sharded by samples.

    from caramel.admm import AdmmOptions, DlAdmm, sharded_dladmm
"""
from caramel.admm.distributed import allreduce_total, shard, sharded_dladmm
from caramel.admm.options import AdmmOptions
from caramel.admm.trainer import DlAdmm

__all__ = ["AdmmOptions", "DlAdmm", "allreduce_total", "shard", "sharded_dladmm"]

"""DDRL: distributed deep representation learning (Dong et al.): a feature hierarchy fitted
from statistics merged across ranks, then a small classifier trained data-parallel.

    from caramel.ddrl import DdrlExtractor, DdrlOptions, allreduce_total
"""
from caramel.ddrl.extractor import DdrlExtractor, DdrlLayer
from caramel.ddrl.model import DdrlNet, allreduce_total
from caramel.ddrl.options import DdrlOptions

__all__ = ["DdrlExtractor", "DdrlLayer", "DdrlNet", "DdrlOptions", "allreduce_total"]

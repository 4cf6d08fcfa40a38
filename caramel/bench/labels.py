"""A bench configuration's label (the key of a report's groups and of its saved prediction inputs).

Kept free of torch and of the bench's runtime so that tools reading stored bench JSON (the
experiments' checkers) can key records the way the bench did without paying torch's import.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Mapping

# `caramel.bench.record.Record`'s defaults for the fields a label reads (older records lack some)
_LABEL_DEFAULTS: dict[str, Any] = {"batch_size": None, "model_options": {}, "bandwidth": None, "target_ratio": None,
                                   "slow_worker": None, "slow_link": None, "jitter": None, "nproc_per_node": 1}


def config_label(r: Any) -> str:
    """The label of record `r` (a `Record`, or anything with its label fields as attributes)."""
    opts = "".join(f",{k}={v}" for k, v in sorted(r.model_options.items()))
    batch = f"b={r.batch_size}" if r.batch_size else ""
    link = r.bandwidth or (f"comm/compute {r.target_ratio:g}" if r.target_ratio is not None else "loopback")
    slow = [r.slow_worker["rank"], r.slow_worker["factor"]] if r.slow_worker else None
    return (f"{r.model}({batch}{opts}) x{r.workers} @ {link}{heterogeneity_suffix(slow, r.slow_link, r.jitter)}"
            f"{layout_suffix(r.workers, r.nproc_per_node)}")


def config_label_of_dict(d: Mapping[str, Any]) -> str:
    """The label of a record as stored in a bench JSON (`d["records"][i]`), fields absent read as defaults."""
    return config_label(SimpleNamespace(**{**_LABEL_DEFAULTS, **{k: d[k] for k in d if k in _LABEL_DEFAULTS},
                                           "model": d["model"], "workers": d["workers"]}))


def layout_suffix(workers: int, nproc_per_node: int) -> str:
    """A configuration label's hosts when ranks share one (`BenchConfig.nproc_per_node`); none
    for one rank per host, so labels written before the field read the same."""
    hosts = workers // nproc_per_node
    return f", {hosts} host{'s' if hosts != 1 else ''} of {nproc_per_node}" if nproc_per_node > 1 else ""


def heterogeneity_suffix(slow_worker: list | None, slow_link: list | None, jitter: list | None) -> str:
    """A configuration label's uneven workers (`BenchConfig.label`, `config_label`): runs with and
    without them are different configurations."""
    out = f", rank {slow_worker[0]} x{slow_worker[1]:g} slower" if slow_worker else ""
    if slow_link:
        out += f", rank {slow_link[0]}'s link /{slow_link[1]:g}"
    if jitter:
        out += f", rank {jitter[0]} jitter +/-{jitter[1]:g} (seed {jitter[2]})"
    return out

"""How often the host-sharing passes of a pipeline's prediction end without settling.

`simulate_pipeline` on a host whose ranks share cores repeats the simulation at the speeds the
host's load gives until that factor settles; a cut chosen inside the passes (`partition="auto"`
with given counts) can pick another cut at the next factor, and the passes can cycle
(`meta["sharing"]["settled"]` False: docs/pipeline.md, "Ranks sharing a host"). This counts the
unsettled ends over seeded random shared-host cases, for `replicas="auto"` (whose candidates
settle on their own) and for `partition="auto"` with given stages and replicas:

    PYTHONPATH=. python experiments/pipeline_sharing_cycles.py [--cases 1000] [--seed 0] [--sharing-model stage] [--json OUT]

`--sharing-model` (`caramel.topology.spec.SHARING_MODELS`, default "layout"): the spec's model,
"stage" settling one factor per worker (its stage's) instead of one for the layout.

Cases: a chain of 3-6 layers (4 KB to 200 KB of weights, 1 to 20 ms of compute each), 2-4
workers all on one host (8 samples each) sharing 1.2 cores' worth up to one per rank, 10-300 Mbit/s links,
microbatches "auto" (for replicas=auto), else "auto", 4 or 8. A given layout of 4 stages on a
3-layer chain is refused by the planner (4 stages need 4 layers): those cases are counted apart,
each with its message; any other refusal stops the run. The same cases run on an older checkout
with PYTHONPATH set to it (docs/results/pipeline-sharing-cycles.md); the JSON names the commit
that made it and the command.
"""
from __future__ import annotations

import argparse
import random
import sys

from caramel.errors import CaramelError
from caramel.jsonio import format_tag, write_json
from caramel.sim.synthetic import synthetic_profile
from caramel.strategies.pipeline.options import PipelineOptions
from caramel.strategies.pipeline.simulate import simulate_pipeline
from caramel.topology.spec import SHARING_MODELS, ClusterSpec

_GIVEN_COUNTS = {2: [(2, 1)], 3: [(3, 1)], 4: [(2, 2), (4, 1)]}  # workers: (stages, replicas)


def random_case(rng: random.Random, sharing_model: str = "layout") -> tuple:
    """A profile, a shared-host spec and the two option sets (replicas=auto; a given layout)."""
    layers = rng.randint(3, 6)
    prof = synthetic_profile(sizes_bytes=[rng.randint(4096, 200_000) for _ in range(layers)],
                             times_s=[rng.uniform(1e-3, 20e-3) for _ in range(layers)])
    prof.batch_size = 8  # samples per rank: the choosers' microbatch counts must divide the step's batch
    workers = rng.randint(2, 4)
    spec = ClusterSpec.uniform(workers, rng.uniform(10e6, 300e6), ranks_per_host=workers,
                               alone_speedup=rng.uniform(1.2, workers), sharing_model=sharing_model)
    microbatches = rng.choice(["auto", 4, 8])
    stages, replicas = rng.choice(_GIVEN_COUNTS[workers])
    options = {"replicas=auto": PipelineOptions(replicas="auto"),
               "partition=auto, given counts": PipelineOptions(stages=stages, replicas=replicas,
                                                               microbatches=microbatches)}
    return prof, spec, options


def count(cases: int, seed: int, sharing_model: str = "layout") -> dict:
    rng = random.Random(seed)
    out: dict = {"cases": cases, "seed": seed, "sharing_model": sharing_model, "kinds": {}}
    for i in range(cases):
        prof, spec, options = random_case(rng, sharing_model)
        layers = len(prof.params)  # synthetic_profile: one parameter per layer
        for kind, opts in options.items():
            k = out["kinds"].setdefault(kind, {"simulations": 0, "unsettled": 0, "unsettled_cases": [],
                                               "max_passes": 0, "refused": 0, "refused_cases": []})
            try:
                sharing = simulate_pipeline(prof, spec, opts).meta["sharing"]
            except CaramelError as e:
                if not (isinstance(opts.stages, int) and opts.stages > layers):
                    raise  # not the layout the generator can draw too deep: a failure, not a count
                k["refused"] += 1
                k["refused_cases"].append({"case": i, "error": str(e)})
                continue
            k["simulations"] += 1
            k["max_passes"] = max(k["max_passes"], sharing["passes"])
            if not sharing["settled"]:
                k["unsettled"] += 1
                k["unsettled_cases"].append(i)
    return out


def _commit() -> str:
    """The commit of the caramel checkout that ran (older checkouts lack `code_version`)."""
    try:
        from caramel.bench.provenance import code_version
    except ImportError:
        from pathlib import Path
        import subprocess

        import caramel
        root = Path(caramel.__file__).resolve().parent.parent
        def git(*args: str) -> str | None:
            out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
            return out.stdout.strip() if out.returncode == 0 else None

        commit = git("rev-parse", "--short=12", "HEAD")
        if not commit:
            return "unknown"
        dirty = git("status", "--porcelain", "--untracked-files=no")
        # Same marks as code_version: `-dirty` where tracked files differ, unknown if git failed.
        return commit + ("-dirty" if dirty else "" if dirty is not None else "-dirty-unknown")
    return code_version()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=1000, help="random cases, each simulated once per kind (default 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sharing-model", choices=SHARING_MODELS, default="layout",
                   help="the spec's host-sharing model (default layout: one factor per layout)")
    p.add_argument("--json", metavar="OUT", help="write the counts here")
    args = p.parse_args(argv)
    if args.cases < 1:
        p.error(f"--cases must be >= 1, got {args.cases}")
    result = {"format": format_tag("pipeline-sharing-cycles"), "commit": _commit(), "command": "PYTHONPATH=. python experiments/pipeline_sharing_cycles.py "
              + " ".join(sys.argv[1:] if argv is None else argv), **count(args.cases, args.seed, args.sharing_model)}
    for kind, k in result["kinds"].items():
        print(f"{kind}: {k['unsettled']} of {k['simulations']} unsettled (at most {k['max_passes']} passes; "
              f"{k['refused']} refused)"
              + (f"; cases {k['unsettled_cases']}" if k["unsettled_cases"] else ""))
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

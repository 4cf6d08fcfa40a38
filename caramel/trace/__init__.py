"""Timelines and metrics: one event schema for measured and predicted runs, and the tools on it.

- `events`: the `Trace` / `TraceEvent` schema (caramel.trace/1); `recorder`: the runtime's recorder.
- `load`: read per-rank files, directories, multi-rank files, with validation.
- `chrome`: Chrome/Perfetto JSON (a process per rank, properly nested lanes, ready -> wait arrows).
- `summary` and `metrics`: per-step metrics and the shared formulas (U, L, E, overlap %, algbw/busbw).
- `plot`: PNG timelines, measured above predicted.  `validate`: `check_trace(trace, plan)`.
- `progress`: rank-0 tqdm bar and optional TensorBoard.  `torch_profiler`: HTA-ready Kineto traces.

Submodules are imported where used, so `import caramel.trace` stays cheap (no matplotlib or torch).
"""

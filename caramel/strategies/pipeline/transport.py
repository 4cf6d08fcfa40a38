"""When the pipeline's activations and gradients move: each rank's sends and recvs as the
runtime's schedule posts them, and gloo's rendezvous between them.

A gloo send cannot start until the receiver has posted its recv (tcp `Pair`: "sends cannot
execute until the remote side is ready to receive"; the recv's notice takes a link latency to
reach the sender). So a transfer starts at max(send issued, recv posted + latency), and a
schedule that posts its recv only when it reaches the action that needs it holds the sender's
data until then. Each schedule's program (one list of ops per lane), read from the runtime:

- `"gpipe"` (torch `ScheduleGPipe`): each action posts its recv when it is reached and waits
  for it, computes, issues its send; the forwards' sends are waited before the first backward,
  the backwards' at the end.
- `"1f1b"` (torch `Schedule1F1B`): warmup forwards post, wait, compute, wait the previous
  send, issue theirs; in the steady phase an action's send is held and issued together with
  the next action's recv (`batch_isend_irecv`), both waited before that action computes, so a
  rank does not start its next compute until its last send has gone; cooldown backwards as the
  warmup forwards; the last send waited at the end.
- `"interleaved"` (torch's runtime over `pipeline_order_with_comms`): recvs posted and sends
  issued at their own places in torch's lowered order, a recv waited by its action, the sends
  at the end of the step.
- `"pipedream"` (`pipedream.py`): a blocking recv at each action, sends waited at the end.

A lane's sends to one peer go in issue order (one socket); the lane's link carries one
transfer at a time, in the order they can start (a send to a peer that has not posted does not
hold a send to another). A transfer that lands is also its send's completion (gloo's send
returns once its bytes have left; the latency's difference is not modelled).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

from caramel.errors import CaramelError
from caramel.strategies.pipeline.timeline import Action

POSTINGS = ("gpipe", "1f1b", "pipedream", "interleaved")
TRANSPORTS = ("rendezvous", "eager")  # the simulator's transfer models: as posted, or at the action's end
Op = tuple  # ("recv", msg) | ("send", msg) | ("wait", msgs) | ("run", action) | ("end", segment)


def posting_for(transport: str, schedule: str, what: str) -> str | None:
    """The posting a `transport` replays `schedule` with (None: eager); an unknown transport is
    an error naming `what` asked for it and the allowed values."""
    if transport not in TRANSPORTS:
        raise CaramelError(f"{what}: transport must be one of {TRANSPORTS}, got {transport!r}")
    return schedule if transport == "rendezvous" else None


def source(a: Action, n: int) -> Action | None:
    """The action whose output `a` consumes from another stage (its message), or None."""
    s, kind, i = a
    if kind == "F":
        return (s - 1, "F", i) if s > 0 else None
    return (s + 1, "B", i) if s < n - 1 else None


def target(a: Action, n: int) -> Action | None:
    """The action on another stage that consumes `a`'s output, or None."""
    s, kind, i = a
    if kind == "F":
        return (s + 1, "F", i) if s < n - 1 else None
    return (s - 1, "B", i) if s > 0 else None


def eager_ready_s(a: Action, n: int, done: dict[Action, float], arrival: dict[Action, float]) -> float | None:
    """Eager transport: when `a`'s input is there (its source's send landed; the last stage's
    backward: its own forward ended; a first forward: 0), or None while that has not run."""
    s, kind, i = a
    dep = source(a, n) or ((s, "F", i) if kind == "B" else None)
    if dep is None:
        return 0.0
    return arrival.get(dep, done[dep]) if dep in done else None


def send_eager(a: Action, end_s: float, n: int, lane: int, where: dict[Action, int], transfer_s: list[float],
               landed_s: list[float], arrival: dict[Action, float], wires: list[list[tuple[float, float]]]) -> None:
    """Eager transport: `a`'s output, if another lane consumes it, leaves when `a` ends and the
    lane's earlier sends have landed (one send at a time, in the lane's order); it lands a
    transfer later, and both ends' wires record it (both ends' threads work)."""
    to = target(a, n)
    if to is None or where[to] == lane:
        return
    sent = max(end_s, landed_s[lane])
    arrival[a] = landed_s[lane] = arrive = sent + transfer_s[min(a[0], to[0])]
    wires[lane].append((sent, arrive))
    wires[where[to]].append((sent, arrive))


def _schedule_order(schedule: str, acts: list[Action], n: int) -> list[Action]:
    """The order torch's schedule runs `acts`' microbatches in on their stage (gpipe: every
    forward, then every backward; 1f1b: `min(m, n - s)` warmup forwards, then one backward and
    one forward until the forwards run out, then the backwards), in `acts`' forward order."""
    s, fwd = acts[0][0], [a[2] for a in acts if a[1] == "F"]
    if schedule == "gpipe":
        return [(s, "F", i) for i in fwd] + [(s, "B", i) for i in fwd]
    warm = min(len(fwd), n - s)
    out = [(s, "F", i) for i in fwd[:warm]]
    for k, i in enumerate(fwd):
        out += [(s, "B", i)] + ([(s, "F", fwd[warm + k])] if warm + k < len(fwd) else [])
    return out


def _torch_program(schedule: str, acts: list[Action], n: int) -> list[Op]:
    """One lane's ops for one run of a single-stage schedule over `acts` (one stage). The ops
    are placed by where torch's schedule places them, so `acts` must be in that schedule's own
    order (pipedream posts per action and takes any)."""
    if schedule != "pipedream" and acts != _schedule_order(schedule, acts, n):
        raise CaramelError(f"pipeline simulation: stage {acts[0][0]}'s actions are not in {schedule}'s order "
                           f"(got {acts}, expected {_schedule_order(schedule, acts, n)})")
    out: list[Op] = []

    def recv(a):
        src = source(a, n)
        return [("recv", src)] if src else []

    def send(a):
        return [("send", a)] if target(a, n) else []

    def wait(msgs):
        return [("wait", tuple(x for x in msgs if x))]

    if schedule == "pipedream":
        for a in acts:
            out += recv(a) + wait([source(a, n)]) + [("run", a)] + send(a)
        return out + wait([a for a in acts if target(a, n)])
    if schedule == "gpipe":
        fwd = [a for a in acts if a[1] == "F"]
        for j, a in enumerate(acts):
            if j == len(fwd):  # the forwards' sends, before the first backward
                out += wait([x for x in fwd if target(x, n)])
            out += recv(a) + wait([source(a, n)]) + [("run", a)] + send(a)
        return out + wait([a for a in acts if a[1] == "B" and target(a, n)])
    # 1f1b, torch's Schedule1F1B: warmup forwards, the fused steady phase, cooldown backwards
    s, m = acts[0][0], sum(1 for a in acts if a[1] == "F")
    warm = min(m, n - s)
    last_send = None
    for j, a in enumerate(acts[:warm]):
        out += recv(a) + wait([source(a, n)]) + [("run", a)] + wait([last_send])
        last_send = a if target(a, n) else None
        if j < warm - 1:
            out += send(a)
    held = acts[warm - 1]  # its send goes with the first backward's recv
    k = warm
    while k < len(acts) and not (acts[k][1] == "B" and acts[k - 1][1] == "B"):
        a = acts[k]
        out += send(held) + recv(a) + wait([held if target(held, n) else None, source(a, n)]) + [("run", a)]
        held, k = a, k + 1
    out += send(held)
    last_send = held if target(held, n) else None
    for a in acts[k:]:
        out += recv(a) + wait([source(a, n)]) + [("run", a)] + wait([last_send]) + send(a)
        last_send = a if target(a, n) else None
    return out + wait([last_send])


def _interleaved_programs(actions: list[list[Action]], n: int) -> list[list[Op]]:
    """Each lane's ops from torch's own lowered order (sends and recvs placed by torch)."""
    from torch.distributed.pipelining import ScheduleInterleaved1F1B

    positions = len(actions)
    m = sum(1 for a in actions[0] if a[1] == "F") // len({a[0] for a in actions[0]})
    fake = [SimpleNamespace(num_stages=n, group_size=positions, group_rank=0, is_last=False, stage_index=i)
            for i in range(0, n, positions)]
    order = ScheduleInterleaved1F1B(fake, m, loss_fn=lambda out, t: out).pipeline_order_with_comms
    out = []
    for p in range(positions):
        ops: list[Op] = []
        sent = []
        for a in order[p]:
            kind, s, i = a.computation_type.value, a.stage_index, a.microbatch_index
            if kind in ("F", "B"):
                src = source((s, kind, i), n)
                ops += [("wait", (src,) if src and src[0] % positions != p else ()), ("run", (s, kind, i))]
            elif kind in ("SEND_F", "SEND_B"):
                ops.append(("send", (s, kind[-1], i)))
                sent.append((s, kind[-1], i))
            elif kind in ("RECV_F", "RECV_B"):
                ops.append(("recv", source((s, kind[-1], i), n)))
        if [op[1] for op in ops if op[0] == "run"] != actions[p]:
            raise CaramelError("pipeline simulation: torch's interleaved order differs from the replayed one")
        out.append(ops + [("wait", tuple(sent))])
    return out


def lane_programs(posting: str, actions: list[list[Action]], n: int,
                  segment: Callable[[int], int] = lambda i: 0) -> list[list[Op]]:
    """Each lane's ops: its actions cut into runs of the schedule (a new run where
    `segment(microbatch)` changes: a virtual pipeline, a step), each run's ops as the runtime
    posts them, an ("end", segment) op after each run."""
    if posting not in POSTINGS:
        raise CaramelError(f"pipeline simulation: posting must be one of {POSTINGS}, got {posting!r}")
    if posting == "interleaved":
        return [ops + [("end", 0)] for ops in _interleaved_programs(actions, n)]
    out = []
    for acts in actions:
        ops: list[Op] = []
        runs: list[list[Action]] = []
        for a in acts:
            if not runs or segment(runs[-1][-1][2]) != segment(a[2]) or runs[-1][-1][0] != a[0]:
                runs.append([])
            runs[-1].append(a)
        for run in runs:
            ops += _torch_program(posting, run, n) + [("end", segment(run[0][2]))]
        out.append(ops)
    return out


@dataclass
class Transfers:
    """The lanes' messages: when each send was issued, each recv posted, each transfer landed;
    each lane's link (free from `link_free_s`) and its sends not yet on it, in issue order."""

    where: dict[Action, int]
    transfer_s: list[float]
    latency_s: float
    issued_s: dict[Action, float] = field(default_factory=dict)
    posted_s: dict[Action, float] = field(default_factory=dict)
    landed_s: dict[Action, float] = field(default_factory=dict)
    link_free_s: list[float] = field(default_factory=list)
    pending: list[list[Action]] = field(default_factory=list)
    wires: list[list[tuple[float, float]]] = field(default_factory=list)

    def local(self, msg: Action, n: int) -> bool:
        """A message between two stages on one lane (or from an action never run: never lands)."""
        return msg in self.where and self.where[msg] == self.where.get(target(msg, n))

    def place(self, p: int, n: int) -> None:
        """Put lane p's sends whose recv is posted on its link, each after the earlier ones to
        the same peer."""
        blocked: set[int] = set()
        keep = []
        for msg in self.pending[p]:
            peer = self.where[target(msg, n)]
            if peer in blocked or msg not in self.posted_s:
                blocked.add(peer)
                keep.append(msg)
                continue
            start = max(self.issued_s[msg], self.posted_s[msg] + self.latency_s, self.link_free_s[p])
            self.landed_s[msg] = self.link_free_s[p] = end = start + self.transfer_s[min(msg[0], target(msg, n)[0])]
            self.wires[p].append((start, end))
            self.wires[peer].append((start, end))
        self.pending[p] = keep


def run_programs(programs: list[list[Op]], n: int, transfer_s: list[float], latency_s: float,
                 compute: Callable[[int, Action, float], float],
                 on_end: Callable[[int, int, float], float] = lambda p, seg, t: t,
                 ) -> tuple[list[float], list[list[tuple[float, float]]]]:
    """Run every lane's ops: `compute(lane, action, start)` returns when the lane is free after
    it, `on_end(lane, segment, t)` when a run of the schedule has returned. Returns each lane's
    end and its wire intervals (transfers from or to it)."""
    lanes = len(programs)
    where = {op[1]: p for p, ops in enumerate(programs) for op in ops if op[0] == "run"}
    tr = Transfers(where, transfer_s, latency_s, link_free_s=[0.0] * lanes, pending=[[] for _ in range(lanes)],
                   wires=[[] for _ in range(lanes)])
    t, pc = [0.0] * lanes, [0] * lanes
    while any(pc[p] < len(programs[p]) for p in range(lanes)):
        progressed = False
        for p, ops in enumerate(programs):
            while pc[p] < len(ops):
                kind, arg = ops[pc[p]]
                if kind == "recv" and not tr.local(arg, n):
                    tr.posted_s[arg] = t[p]
                    if arg in where:
                        tr.place(where[arg], n)
                elif kind == "send" and not tr.local(arg, n):
                    tr.issued_s[arg] = t[p]
                    tr.pending[p].append(arg)
                    tr.place(p, n)
                elif kind == "wait":
                    remote = [x for x in arg if not tr.local(x, n)]
                    if any(x not in tr.landed_s for x in remote):
                        break
                    t[p] = max([t[p]] + [tr.landed_s[x] for x in remote])
                elif kind == "run":
                    t[p] = compute(p, arg, t[p])
                elif kind == "end":
                    t[p] = on_end(p, arg, t[p])
                pc[p] += 1
                progressed = True
        if not progressed:
            raise CaramelError("pipeline simulation: the schedule deadlocks (an action waits for one never run)")
    return t, tr.wires

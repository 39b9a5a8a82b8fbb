#!/usr/bin/env python3
"""Who held a CPU while ic-loadgen's host probe (--host-probe-us) waited.

Reads a kernel trace taken during an ic-loadgen run and, for every probe
wake-up at least --over-us late, says what happened on that CPU between
the probe's sleep and its return:

* "timer late": the probe's timer fired late (its sched_wakeup came late).
  With nothing else on the CPU meanwhile the vCPU was not running (the
  host) or interrupts were off; "every CPU" marks a stall that both probes
  saw at once, consistent with a pause of the host (two guest processes in
  kernel paths, or a guest-wide IPI, can do it too).
* "timer late, probe on the CPU": the probe never left the CPU; its timer
  fired while it was still current (a sched_wakeup of the probe with no
  sched_switch), so nothing else ran on that CPU: the vCPU was not running
  or interrupts were off. These are the host's crawls.
* "held": the timer fired on time but the probe, real-time priority 90,
  got the CPU only later: the task named ("holder") was in a kernel path
  that does not yield (the guest kernel runs preempt=none), or the vCPU
  paused right after the timer fired (nothing else happens on the CPU
  either way; "every CPU" then points at the host). Its tgid says whether
  it was ic-index-server, ic-loadgen or another process: ours can hold a
  CPU against the probe too.
* "unclassified": the probe came back late but no wake-up of it was seen
  (a lost event, or a trace started mid-sleep).

Probes are told apart by pid (their names are all cut to
"ic-loadgen-prob"), and a wake-up is matched to its probe by pid wherever
the event was recorded. The script prints every late return, the lateness
by cause, its total and the unclassified part; with --probe-total-us (the
run's cpu_stalls.total_us, summed over the phases the trace covers) also
how much of the probe's own count the trace did not show.

The trace (root; restore tracing_on to 0 and the events afterwards):

    cd /sys/kernel/tracing
    echo mono > trace_clock; echo 1 > options/record-tgid; echo 65536 > buffer_size_kb
    echo > set_event; for e in sched:sched_switch sched:sched_wakeup \\
        irq_vectors:local_timer_entry timer:hrtimer_expire_entry irq:irq_handler_entry; do
      echo $e >> set_event; done
    echo > trace; echo 1 > tracing_on
    chrt -r 10 ic-loadgen ... --rate 10000 --client-cpus 0 --server-cpus 1
    echo 0 > tracing_on; cp trace /tmp/run.trace; echo > set_event
    stall_culprits.py /tmp/run.trace --period-us 1000 --over-us 500
"""

import argparse
import collections
import re

PROBE = "ic-loadgen-prob"  # the probe threads' names, cut to 15 bytes
PID = re.compile(r"\bpid=(\d+)")
NEXT = re.compile(r"next_comm=(?P<comm>.+?) next_pid=(?P<pid>\d+)")
PREV = re.compile(r"prev_comm=(?P<comm>.+?) prev_pid=(?P<pid>\d+) .*prev_state=(?P<state>\S+)")
LINE = re.compile(
    r"^\s*(?P<comm>.+?)-(?P<pid>\d+)\s+(?:\(\s*(?P<tgid>\S+)\)\s+)?"
    r"\[(?P<cpu>\d+)\] \S+ (?P<ts>\d+\.\d+): (?P<event>\w+): (?P<rest>.*)$"
)


def read(path):
    """Every event in time order: (time, cpu, comm, pid, tgid, event, rest)."""
    events = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = LINE.match(line)
            if m and m["event"] in ("sched_switch", "sched_wakeup"):
                events.append(
                    (float(m["ts"]), int(m["cpu"]), m["comm"], m["pid"], m["tgid"] or "?",
                     m["event"], m["rest"])
                )
    events.sort(key=lambda e: e[0])
    return events


def stalls(events, period, over):
    """Each late return of a probe: (cpu, due, woke, timer_at, holder).

    A probe's cycle starts when it returns from a sleep (switched in after
    a wake-up, or woken while still on the CPU) and its next sleep is due
    `period` later; a switch out asleep marks the sleep's start exactly.
    """
    found = []
    probe = {}  # pid -> {"cpu", "start", "out", "timer_at"}

    def back(pid, ts, holder, timer_at):
        p = probe[pid]
        if p["start"] is not None:
            due = p["start"] + period
            if ts - due >= over:
                found.append((p["cpu"], due, ts, timer_at, holder))
        p.update(start=ts, out=None, timer_at=None)

    for ts, cpu, comm, pid, tgid, event, rest in events:
        if event == "sched_wakeup":
            if f"comm={PROBE}" not in rest:
                continue
            woken = PID.search(rest)[1]
            p = probe.get(woken)
            if p is None:
                continue
            if p["out"] is None:
                # Still on its CPU: the timer fired before it could leave.
                back(woken, ts, "the probe itself (timer late, probe on the CPU)", ts)
            elif p["timer_at"] is None:
                p["timer_at"] = ts
            continue
        prev = PREV.search(rest)
        if prev and prev["comm"] == PROBE:
            p = probe.setdefault(prev["pid"], {"cpu": cpu, "start": None, "out": None, "timer_at": None})
            p["cpu"] = cpu
            if prev["state"].startswith(("S", "D")):
                p.update(start=ts, out="S", timer_at=None)
            else:
                p["out"] = "R"
        nxt = NEXT.search(rest)
        if nxt and nxt["comm"] == PROBE:
            p = probe.setdefault(nxt["pid"], {"cpu": cpu, "start": None, "out": "S", "timer_at": None})
            p["cpu"] = cpu
            if p["out"] == "S" or p["timer_at"] is not None:
                back(nxt["pid"], ts, f"{comm}/{pid} (tgid {tgid})", p["timer_at"])
            else:
                p["out"] = None
    return sorted(found, key=lambda s: s[1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--period-us", type=float, default=1000.0)
    ap.add_argument("--over-us", type=float, default=500.0)
    ap.add_argument("--probe-total-us", type=float, default=None,
                    help="the run's cpu_stalls.total_us over the phases the trace covers")
    args = ap.parse_args()
    found = stalls(read(args.trace), args.period_us / 1e6, args.over_us / 1e6)
    by_cause = collections.Counter()
    for cpu, due, woke, timer_at, holder in found:
        every = any(o[0] != cpu and o[1] < woke and due < o[2] for o in found)
        late = (woke - due) * 1e6
        both = ", every CPU" if every else ""
        if timer_at is None:
            kind = key = "unclassified (no wake-up of the probe seen)"
        elif holder.startswith("the probe itself"):
            kind = "timer late, probe on the CPU" + both
            key = "timer late, the probe on the CPU (host or interrupts off)" + both
        elif timer_at - due >= args.over_us / 1e6 / 2:
            kind = "timer late" + both
            key = "timer late (host or interrupts off)" + both
        else:
            kind = "held" + both
            key = "held by " + re.sub(r"/\d+ ", " ", holder) + both
        timer = f"{(timer_at - due) * 1e6:.0f}" if timer_at is not None else "?"
        print(f"cpu{cpu} {due:.6f} late {late:6.0f} us (timer {timer} us): {kind}; on the CPU: {holder}")
        by_cause[key] += late
    total = sum(by_cause.values())
    print("\nlateness by cause (us):")
    for key, part in by_cause.most_common():
        print(f"  {part:9.0f}  {key}")
    print(f"  {total:9.0f}  total, {len(found)} late returns")
    unclassified = by_cause["unclassified (no wake-up of the probe seen)"]
    print(f"  {unclassified:9.0f}  of it unclassified")
    if args.probe_total_us is not None:
        print(f"  {args.probe_total_us - total:9.0f}  of the probe's own {args.probe_total_us:.0f} "
              "not seen in the trace")


if __name__ == "__main__":
    main()

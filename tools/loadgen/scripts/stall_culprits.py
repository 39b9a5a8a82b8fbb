#!/usr/bin/env python3
"""Who held a CPU while ic-loadgen's host probe (--host-probe-us) waited.

Reads a kernel trace taken during an ic-loadgen run and, for every probe
wake-up at least --over-us late, says what happened on that CPU between
the probe's sleep and its return:

* "timer late": the probe's timer fired late (its sched_wakeup came late).
  With nothing else on the CPU meanwhile the vCPU was not running (the
  host) or interrupts were off; "every CPU" marks a stall that both probes
  saw at once, which only the host can cause.
* "held": the timer fired on time but the probe, real-time priority 90,
  got the CPU only later: the task named ("holder") was in a kernel path
  that does not yield (the guest kernel runs preempt=none), or the vCPU
  paused right after the timer fired (nothing else happens on the CPU
  either way; "every CPU" then points at the host). Its tgid says whether
  it was ic-index-server, ic-loadgen or another process.

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
LINE = re.compile(
    r"^\s*(?P<comm>.+?)-(?P<pid>\d+)\s+(?:\(\s*(?P<tgid>\S+)\)\s+)?"
    r"\[(?P<cpu>\d+)\] \S+ (?P<ts>\d+\.\d+): (?P<event>\w+): (?P<rest>.*)$"
)


def read(path):
    """Events per CPU: (time, comm, pid, tgid, event, rest)."""
    per_cpu = collections.defaultdict(list)
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = LINE.match(line)
            if m:
                per_cpu[int(m["cpu"])].append(
                    (float(m["ts"]), m["comm"], m["pid"], m["tgid"] or "?", m["event"], m["rest"])
                )
    return per_cpu


def stalls(per_cpu, period, over):
    """Each late return of a probe: (cpu, due, woke, timer_at, holder)."""
    found = []
    for cpu, events in per_cpu.items():
        slept = None
        for ts, comm, pid, tgid, event, rest in events:
            if event == "sched_wakeup" and f"comm={PROBE}" in rest and slept:
                slept["timer_at"] = slept.get("timer_at", ts)
            if event != "sched_switch":
                continue
            if f"prev_comm={PROBE}" in rest and "prev_state=S" in rest:
                slept = {"at": ts}
            elif f"next_comm={PROBE}" in rest and slept:
                due = slept["at"] + period
                if ts - due >= over:
                    found.append((cpu, due, ts, slept.get("timer_at"), f"{comm}/{pid} (tgid {tgid})"))
                slept = None
    return sorted(found, key=lambda s: s[1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--period-us", type=float, default=1000.0)
    ap.add_argument("--over-us", type=float, default=500.0)
    args = ap.parse_args()
    found = stalls(read(args.trace), args.period_us / 1e6, args.over_us / 1e6)
    by_holder = collections.Counter()
    for cpu, due, woke, timer_at, holder in found:
        every = any(o[0] != cpu and o[1] < woke and due < o[2] for o in found)
        late = (woke - due) * 1e6
        both = ", every CPU" if every else ""
        if timer_at is not None and timer_at - due >= args.over_us / 1e6 / 2:
            kind = "timer late" + both
            key = "timer late (host or interrupts off)" + both
        else:
            kind = "held" + both
            key = "held by " + re.sub(r"/\d+ ", " ", holder) + both
        timer = f"{(timer_at - due) * 1e6:.0f}" if timer_at is not None else "?"
        print(f"cpu{cpu} {due:.6f} late {late:6.0f} us (timer {timer} us): {kind}; on the CPU: {holder}")
        by_holder[key] += late
    print("\nlateness by cause (us):")
    for key, total in by_holder.most_common():
        print(f"  {total:9.0f}  {key}")


if __name__ == "__main__":
    main()

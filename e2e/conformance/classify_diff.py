"""Sorts the differences coordinator_diff.py wrote (its FULL.json) into the
kinds docs/coordinator.md lists under "Request edges not reproduced", and
prints every difference of no known kind (there should be none).

Usage: python3 classify_diff.py FULL.json
"""

import collections
import json
import sys

# Integer literals past 64 bits (and their neighbours at the edge) that the
# audit sends; Python holds them, the directory keys are 64-bit.
BIG = ["100000000000000000000", "9223372036854775808", "9223372036854775807", "18446744073709551616",
       "1111111111111111111111111", "9223372036854775809", "99999999999999999999"]


# The listings and counts whose contents the big integers' requests
# changed (on one side only): a GET of anything else that differs is a
# difference of its own. (On equal states, tests/reference_diff.rs compares
# /directory/stats and the listings exactly.)
LISTINGS = ("/instances", "/instances/usage", "/instances/i1/usage", "/directory/keys", "/directory/stats",
            "/cache/pins", "/quota", "/quota/t1", "/quota/_default", "/quota/config")

# What makes the reference answer 500 where this one answers: floats past
# what its JSON encoder writes (inf, nan, 1e400, or 1e+308 once scaled) and
# lone surrogate escapes it cannot encode back.
CRASHERS = ("inf", "nan", "1e400", "1e+308", "\\ud800")


def placements_only(ref, ours):
    """Two lookup answers that differ only in their placements."""
    if not (isinstance(ref, dict) and isinstance(ours, dict)):
        return False
    rr, ro = ref.get("results"), ours.get("results")
    if not (isinstance(rr, list) and isinstance(ro, list) and len(rr) == len(ro)):
        return False
    return all({k for k in set(x) | set(y) if x.get(k) != y.get(k)} <= {"placements"} for x, y in zip(rr, ro))


def kind(m, p, b, a, o):
    ours = json.dumps(o[2])
    if p.split("?")[0].rstrip("/") in ("/status", "/live", "/ready"):
        return "house routes"
    if any(s in b or s in p for s in BIG):
        return "integers past 64 bits"
    if "/cache/prefetches" in p and a[0] == 502:
        return "upstream error text"
    listing = m == "GET" and p.split("?")[0].rstrip("/") in LISTINGS
    if a[0] == o[0] == 200 and (listing or placements_only(a[2], o[2])):
        return "knock-on listing or lookup (state left by the big integers)"
    if "world_size must be <= 255" in ours or "out of range for u32" in ours:
        return "house bounds"
    if "finite_number" in ours or (a[0] == 500 and any(s in b.lower() for s in CRASHERS)):
        return "inf/nan/1e400/lone surrogates (taken by the reference, or its 500)"
    if "not valid hex" in ours:
        return "hex with spaces"
    return None


def main():
    diffs = json.load(open(sys.argv[1]))
    counts = collections.Counter()
    other = []
    for m, p, h, b, a, o in diffs:
        k = kind(m, p, b, a, o)
        counts[k or "OTHER"] += 1
        if k is None:
            other.append((m, p, b[:200], a, o))
    for k, v in counts.most_common():
        print(v, k)
    for m, p, b, a, o in other:
        print("OTHER", m, p, repr(b), "\n  ref: ", json.dumps(a)[:300], "\n  ours:", json.dumps(o)[:300])


if __name__ == "__main__":
    main()

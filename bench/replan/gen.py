#!/usr/bin/env python3
"""Straggling rates for the planner benchmark: a {"rank": rate} map with
`fraction` of the ranks (at least one) slowed to rates drawn uniformly from
[lo, hi], seeded; healthy ranks get measurement noise below 1.2."""
import json
import random
import sys


def main():
    if len(sys.argv) != 6:
        sys.exit("usage: gen.py WORLD FRACTION LO HI SEED")
    world, frac, lo, hi, seed = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), \
        float(sys.argv[4]), int(sys.argv[5])
    rng = random.Random(seed)
    rates = {r: round(1.0 + rng.uniform(0, 0.15), 3) for r in range(world)}
    n = max(1, round(frac * world))
    for r in rng.sample(range(world), n):
        rates[r] = round(rng.uniform(lo, hi), 2)
    json.dump({str(r): x for r, x in sorted(rates.items())}, sys.stdout)
    print()


if __name__ == "__main__":
    main()

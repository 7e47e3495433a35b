"""Issue 9: faults and bad input, tried with real processes as an adversary would."""

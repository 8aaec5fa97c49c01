"""`python -m pipeline tune`: serving configurations chosen by measurement (see space, policy, trial, results, apply)."""

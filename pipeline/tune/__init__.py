"""Serving configurations chosen by measurement: the search space, the policy, one trial (a load
test), the results and the Pareto table, the cache that resumes a search, and applying the winner.

May import: core, data, loadtest, mig, triton.
"""

"""Judging a variant against FP32: what each output is (outputkinds), the labeled evaluation data
(evaldata), each kind's figures (taskstats) and their confidence bounds (bounds), the limits
(gates), a streaming comparison batch by batch (compare) and the verdict (judging). The build's
accuracy stage and ``verify``'s served gate both judge through here.

May import: core, data.
"""

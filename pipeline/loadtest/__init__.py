"""Load tests of a Triton server: the load policy, the engine and its loop, HTTP/gRPC/shared-memory
clients, measurement windows with a stability check, statistics apart, and the results and plots.

May import: core, data.
"""

"""The commands: one module each (build, fleet, serve, verify, deploy, loadtest, tune, mig_plan,
inspect, report), turning flags and ``--config`` files (configfile) into calls of the packages below.
``pipeline/cli.py`` registers them.

May import: core, data, backend, accuracy, models, stages, inspect, triton, loadtest, mig, tune, reports, build.
"""

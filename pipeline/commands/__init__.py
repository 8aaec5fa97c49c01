"""The commands: one module each (build, serve, verify, deploy, loadtest, tune, mig_plan for
``mig-plan``, inspect, report), with ``build --fleet`` in fleet and ``--config``/``--print-config`` in
configfile, turning flags and config files into calls of the packages below. ``pipeline/cli.py``
registers them.

May import: core, data, backend, accuracy, models, stages, inspect, triton, loadtest, mig, tune, reports, build.
"""

"""MLPerf Inference's scenarios, run by MLPerf's own LoadGen (``mlcommons-loadgen``): the scenario settings and
LoadGen's configuration files (settings), a test run against a system under test (run), and the verdict read back
from LoadGen's detail log (verdict). Part of the loadtest package: it imports what loadtest may (core, data).
"""

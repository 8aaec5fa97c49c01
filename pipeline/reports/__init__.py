"""What a person reads: the build's terminal tables (terminal), the rows of its tables and of its
variants (build_tables, variants), the variants' chart (variant_chart), the one-page HTML report of
builds, load tests and tune runs (html), and where the reports go (dirs).

May import: core, loadtest.
"""

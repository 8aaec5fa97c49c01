"""Bundled models: the default digits CNN, trained deterministically from data that ships offline.

May import: core, data.
"""

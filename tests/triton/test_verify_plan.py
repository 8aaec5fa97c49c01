"""Mutation-killing tests (issue 29); filled in by this session."""

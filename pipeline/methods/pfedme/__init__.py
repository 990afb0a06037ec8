"""The pfedme method (method.py)."""

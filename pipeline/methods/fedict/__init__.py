"""The fedict method (method.py)."""

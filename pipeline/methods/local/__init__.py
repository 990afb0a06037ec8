"""The local method (method.py)."""

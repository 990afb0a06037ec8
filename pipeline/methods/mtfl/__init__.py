"""The mtfl method (method.py)."""

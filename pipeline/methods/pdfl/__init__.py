"""The pdfl method (method.py)."""

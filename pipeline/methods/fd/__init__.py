"""The fd method (method.py)."""

"""The fedalt method (method.py)."""

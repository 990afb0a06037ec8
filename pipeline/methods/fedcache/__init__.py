"""The fedcache method (method.py)."""

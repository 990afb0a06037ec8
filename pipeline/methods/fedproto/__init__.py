"""The fedproto method (method.py)."""

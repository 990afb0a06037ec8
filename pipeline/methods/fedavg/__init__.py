"""The fedavg method (method.py)."""

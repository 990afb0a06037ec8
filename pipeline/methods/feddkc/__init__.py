"""The feddkc method (method.py)."""

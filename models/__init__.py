"""Network definitions shared by every algorithm."""

"""Privacy attacks on a finished run: what a curious server and a third party learn (issue 40)."""

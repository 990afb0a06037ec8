"""Streamlit dashboard over the DuckDB results (`make dashboard`).

- `dashboard.config`: where the app reads from (env vars / CLI args, defaults under the repo).
- `dashboard.data`: pure data access (DuckDB read-only with lock retries, partition stats,
  cache DB neighbours, params diff); returns pandas frames, no Streamlit imports.
- `dashboard.charts`: Altair chart builders over those frames.
- `dashboard.app`: the Streamlit layout (the only module that imports streamlit).
"""

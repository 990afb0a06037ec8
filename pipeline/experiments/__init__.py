"""Experiment orchestration: presets, sweeps and the DVC experiment helpers."""

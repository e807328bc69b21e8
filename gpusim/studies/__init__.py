"""The studies of the dissertation as functions that return DataFrames (validation scripts and notebooks call them)."""

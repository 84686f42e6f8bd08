"""Typed contracts at every process and file boundary: the job files the runner hands
workers and agents, the calibration result, and ``summary.json``. Each is a pydantic
model, written and read through the same model on both sides."""

"""Orchestrators: commands that drive a deployment end to end (deploy/ for the parts, observe/ for the gate)."""

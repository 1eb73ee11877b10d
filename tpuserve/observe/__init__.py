"""Watching a deployment: the readiness gate, logs and diagnosis. Imports core and deploy/."""
